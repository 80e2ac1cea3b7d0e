//! Signed seals: an Ed25519 signature over each seal's digest, so that a
//! database owner who rewrites rows and recomputes every digest from the
//! published encoding still cannot make the chain verify against the public
//! key kept elsewhere (`oncegate audit verify --public-key`).
//!
//! The signed bytes are the canonical encoding (length-prefixed values, see
//! [`super::canonical`]) of [`SIGNATURE_DOMAIN`], the key id and the digest
//! (64 hex characters). The key id is the first 16 hex characters of
//! SHA-256 over the raw 32-byte public key. Keys are PKCS#8 PEM (private)
//! and SubjectPublicKeyInfo PEM (public), as `openssl` and Python's
//! `cryptography` read them.

use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;

/// The first value of every signed message.
pub const SIGNATURE_DOMAIN: &str = "oncegate audit seal signature v1";

/// The key id of a public key.
pub fn key_id(key: &VerifyingKey) -> String {
    hex::encode(&Sha256::digest(key.as_bytes())[..8])
}

/// The bytes a seal's signature covers.
pub fn signed_message(key_id: &str, digest: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    for v in [SIGNATURE_DOMAIN, key_id, digest] {
        out.extend_from_slice(&(v.len() as u32).to_be_bytes());
        out.extend_from_slice(v.as_bytes());
    }
    out
}

/// The sealer's private key.
pub struct SealSigner {
    key: SigningKey,
    id: String,
}

impl std::fmt::Debug for SealSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SealSigner {{ key_id: {} }}", self.id)
    }
}

impl SealSigner {
    /// Reads a PKCS#8 PEM Ed25519 private key.
    pub fn load(path: &Path) -> Result<Self, String> {
        let pem = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let key = SigningKey::from_pkcs8_pem(&pem)
            .map_err(|e| format!("{}: not a PKCS#8 PEM Ed25519 private key ({e})", path.display()))?;
        Ok(Self::from_key(key))
    }

    pub fn from_key(key: SigningKey) -> Self {
        let id = key_id(&key.verifying_key());
        Self { key, id }
    }

    pub fn key_id(&self) -> &str {
        &self.id
    }

    /// The signature (hex) over `digest`.
    pub fn sign(&self, digest: &str) -> String {
        hex::encode(self.key.sign(&signed_message(&self.id, digest)).to_bytes())
    }
}

/// Public keys a verification accepts, by key id.
#[derive(Debug, Clone, Default)]
pub struct Keyring {
    keys: BTreeMap<String, VerifyingKey>,
}

/// Why a seal's signature does not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignatureProblem {
    UnknownKey(String),
    Invalid(String),
}

impl Keyring {
    /// Reads SubjectPublicKeyInfo PEM Ed25519 public keys.
    pub fn load(paths: &[std::path::PathBuf]) -> Result<Self, String> {
        let mut keys = BTreeMap::new();
        for path in paths {
            let pem = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let key = VerifyingKey::from_public_key_pem(&pem)
                .map_err(|e| format!("{}: not a PEM Ed25519 public key ({e})", path.display()))?;
            keys.insert(key_id(&key), key);
        }
        Ok(Self { keys })
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Checks `signature` (hex) by `key_id` over `digest`.
    pub fn check(&self, key_id: &str, signature: &str, digest: &str) -> Result<(), SignatureProblem> {
        let key = self
            .keys
            .get(key_id)
            .ok_or_else(|| SignatureProblem::UnknownKey(key_id.to_string()))?;
        let bytes: [u8; 64] = hex::decode(signature)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| SignatureProblem::Invalid("its signature is not 64 bytes of hex".into()))?;
        key.verify(&signed_message(key_id, digest), &Signature::from_bytes(&bytes))
            .map_err(|_| SignatureProblem::Invalid(format!("its signature by key {key_id} does not verify")))
    }
}

/// Writes a new private key to `out` (mode 0600, never overwriting) and its
/// public key to `out.pub`; returns the key id.
pub fn keygen(out: &Path) -> Result<String, String> {
    let mut seed = [0u8; 32];
    rand::TryRngCore::try_fill_bytes(&mut rand::rngs::OsRng, &mut seed)
        .map_err(|e| format!("reading the operating system's random source: {e}"))?;
    let key = SigningKey::from_bytes(&seed);
    let private = key
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| format!("encoding the private key: {e}"))?;
    let public = key
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .map_err(|e| format!("encoding the public key: {e}"))?;
    let pub_path = public_path(out);
    for p in [out, pub_path.as_path()] {
        if p.exists() {
            return Err(format!(
                "{} exists already; keygen never overwrites a key",
                p.display()
            ));
        }
    }
    write_new(out, private.as_bytes(), 0o600)?;
    write_new(&pub_path, public.as_bytes(), 0o644)?;
    Ok(key_id(&key.verifying_key()))
}

/// `FILE.pub`.
pub fn public_path(out: &Path) -> std::path::PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(".pub");
    name.into()
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    file.write_all(bytes)
        .and_then(|_| file.sync_all())
        .map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_holds_only_for_its_digest_and_its_key() {
        let a = SealSigner::from_key(SigningKey::from_bytes(&[7; 32]));
        let b = SealSigner::from_key(SigningKey::from_bytes(&[8; 32]));
        let ring = Keyring {
            keys: [(a.key_id().to_string(), a.key.verifying_key())].into(),
        };
        let digest = "ab".repeat(32);
        let sig = a.sign(&digest);
        assert_eq!(ring.check(a.key_id(), &sig, &digest), Ok(()));
        assert!(matches!(
            ring.check(a.key_id(), &sig, &"cd".repeat(32)),
            Err(SignatureProblem::Invalid(_))
        ));
        // b's signature under a's id, and b's own id, are both refused.
        assert!(matches!(
            ring.check(a.key_id(), &b.sign(&digest), &digest),
            Err(SignatureProblem::Invalid(_))
        ));
        assert!(matches!(
            ring.check(b.key_id(), &b.sign(&digest), &digest),
            Err(SignatureProblem::UnknownKey(_))
        ));
    }
}
