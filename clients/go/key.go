package oncegate

import (
	"crypto/sha256"
	"encoding/hex"
)

// PayloadDigest is the lowercase hex SHA-256 of the payload.
func PayloadDigest(payload []byte) string {
	sum := sha256.Sum256(payload)
	return hex.EncodeToString(sum[:])
}

// DeriveKey is the key the sidecar derives for a submission without a key of
// its own, byte for byte (DESIGN §1):
//
//	sha256("{award_id}|{submission_timestamp}|{sha256(payload) hex}") hex
//
// 64 lowercase hex characters. The timestamp is used verbatim: "…45Z" and
// "…45.000Z" are different keys. Never derive a key from broker offsets.
func DeriveKey(awardID, submissionTimestamp string, payload []byte) string {
	h := sha256.New()
	h.Write([]byte(awardID))
	h.Write([]byte{'|'})
	h.Write([]byte(submissionTimestamp))
	h.Write([]byte{'|'})
	h.Write([]byte(PayloadDigest(payload)))
	return hex.EncodeToString(h.Sum(nil))
}

// Key is the submission's idempotency key: its own, or the derived one.
func (s Submission) Key() string {
	if s.IdempotencyKey != "" {
		return s.IdempotencyKey
	}
	return DeriveKey(s.AwardID, s.SubmissionTimestamp, s.Payload)
}
