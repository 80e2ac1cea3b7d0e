package io.oncegate.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.fasterxml.jackson.databind.JsonNode;
import io.oncegate.client.testing.Vectors;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;

/**
 * The shared vectors ({@code clients/vectors/}) against this client alone: the
 * key formula, and its validation giving the sidecar's code and message for
 * every rejection it can check without the sidecar's configuration.
 */
class VectorsTest {
    @Test
    void keysMatchTheVectors() {
        List<JsonNode> keys = Vectors.keys();
        assertTrue(keys.size() >= 90, keys.size() + " key vectors");
        for (JsonNode v : keys) {
            Submission s = Vectors.submission(v);
            String name = v.get("name").asText();
            assertEquals(v.get("payload_sha256").asText(), IdempotencyKey.payloadDigest(s.payload()), name);
            assertEquals(v.get("derived_key").asText(),
                    IdempotencyKey.derive(s.awardId(), s.submissionTimestamp(), s.payload()), name);
            assertEquals(v.get("key").asText(), s.key(), name);
        }
        System.out.println("java parity: " + keys.size() + "/" + keys.size() + " key vectors");
    }

    @Test
    void everyKeyVectorPassesValidation() throws Exception {
        for (JsonNode v : Vectors.keys()) {
            try {
                Validation.checkSubmission(Vectors.submission(v), Validation.MAX_EFFECT_BYTES);
            } catch (GateException e) {
                fail(v.get("name").asText() + ": refused: " + e.getMessage());
            }
        }
    }

    @Test
    void validationGivesTheVectorsCodeAndMessage() {
        List<JsonNode> all = Vectors.rejections();
        List<String> sidecarOnly = new ArrayList<>();
        int checked = 0;
        for (JsonNode r : all) {
            String name = r.get("rpc").asText() + ": " + r.get("name").asText();
            GateException e;
            try {
                e = localAnswer(r);
            } catch (UnsupportedOperationException sidecars) {
                sidecarOnly.add(name);
                continue;
            }
            assertNotNull(e, name + ": accepted");
            assertEquals(r.get("code").asText(), e.code().name(), name);
            assertEquals(r.get("message").asText(), e.serverMessage(), name);
            checked++;
        }
        assertEquals(List.of("SubmitBatch: 1001 items, one over the default limit"), sidecarOnly);
        System.out.println("java parity: " + checked + "/" + all.size()
                + " rejection vectors refused by the client's own validation (the rest: " + sidecarOnly + ")");
    }

    /** What this client's validation answers to a vector, or null when it passes. */
    static GateException localAnswer(JsonNode r) {
        JsonNode v = r.get("request");
        try {
            switch (r.get("rpc").asText()) {
                case "Submit":
                    Validation.checkSubmission(Vectors.submission(v), r.path("max_payload_bytes").asLong(0));
                    break;
                case "Lookup":
                    Validation.checkProducerKey(v.get("idempotency_key").asText());
                    break;
                case "Begin":
                    JsonNode ttl = v.get("lease_ttl");
                    Validation.checkBegin(v.get("namespace").asText(), v.get("idempotency_key").asText(),
                            Vectors.body(v, "request"), ttl == null ? null : Long.parseLong(ttl.get("seconds").asText()),
                            ttl == null ? 0 : ttl.get("nanos").asInt());
                    break;
                case "Complete":
                    Validation.checkComplete(v.get("namespace").asText(), v.get("idempotency_key").asText(),
                            v.get("lease_token").asText(), Vectors.body(v, "response"));
                    break;
                case "Release":
                    Validation.checkRelease(v.get("namespace").asText(), v.get("idempotency_key").asText(),
                            v.get("lease_token").asText(), v.get("reason").asText());
                    break;
                default:
                    throw new UnsupportedOperationException("the sidecar's configuration decides");
            }
            return null;
        } catch (GateException e) {
            return e;
        }
    }

    @Test
    void theRefusedCharsTableReadsAsThisJvmsCategoriesWhereBothKnowTheCharacter() {
        List<String> disagree = new ArrayList<>();
        for (int cp = 0; cp <= Character.MAX_CODE_POINT; cp++) {
            int type = Character.getType(cp);
            if (type == Character.UNASSIGNED) {
                continue; // this runtime's Unicode may be older than the sidecar's
            }
            String expected;
            switch (type) {
                case Character.CONTROL: expected = "control character"; break;
                case Character.FORMAT: expected = "format character"; break;
                case Character.LINE_SEPARATOR:
                case Character.PARAGRAPH_SEPARATOR: expected = "line or paragraph separator"; break;
                case Character.PRIVATE_USE: expected = "private-use character"; break;
                case Character.SURROGATE: expected = "unassigned character"; break;
                default: expected = null;
            }
            if (!java.util.Objects.equals(expected, RefusedChars.refusal(cp))) {
                disagree.add(String.format("U+%04X", cp));
            }
        }
        assertEquals(List.of(), disagree);
        assertTrue(RefusedChars.isWhiteSpace(0xA0) && RefusedChars.isWhiteSpace(0x3000)
                && !RefusedChars.isWhiteSpace('x') && !RefusedChars.isWhiteSpace(0x200B));
    }

    @Test
    void anUnpairedSurrogateIsRefusedBeforeItCouldBeSentAsSomethingElse() {
        GateException e = assertThrows(GateException.class, () -> Validation.checkSubmission(
                Submission.of("AWD-\uD800", "2026-11-29T10:57:45Z", new byte[0], 1), 0));
        assertEquals("award_id is not valid Unicode: unpaired surrogate U+D800", e.serverMessage());
        assertTrue(e.isPoison());
        assertThrows(IllegalArgumentException.class,
                () -> IdempotencyKey.derive("AWD", "2026-11-29T10:57:45Z\uDC00", new byte[0]));
        // A pair is one character: counted once.
        Submission ok = Submission.of("\uD83C\uDF93".repeat(128), "2026-11-29T10:57:45Z", new byte[0], 1);
        assertEquals(64, ok.key().length());
    }
}
