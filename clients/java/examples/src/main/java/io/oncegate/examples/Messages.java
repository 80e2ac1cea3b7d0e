package io.oncegate.examples;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.oncegate.client.Submission;
import java.util.Base64;
import java.util.regex.Pattern;

/**
 * The message body the examples read (the Python examples' format): a JSON
 * object with {@code award_id}, {@code submission_timestamp},
 * {@code amount_cents} (an integer, or an integer in a string),
 * {@code payload} (base64, optional) and {@code idempotency_key} (optional).
 * Errors name the field and never quote the body.
 */
final class Messages {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Pattern INTEGER = Pattern.compile("-?[0-9]+");

    /** A body that is not a submission: dead-letter it. */
    static final class Malformed extends Exception {
        private static final long serialVersionUID = 1L;

        Malformed(String message) {
            super(message);
        }
    }

    private Messages() {}

    static Submission parse(byte[] body) throws Malformed {
        JsonNode doc;
        try {
            doc = JSON.readTree(body == null ? new byte[0] : body);
        } catch (JsonProcessingException e) {
            var at = e.getLocation();
            throw new Malformed(at == null ? "body is not JSON"
                    : "body is not JSON (line " + at.getLineNr() + " column " + at.getColumnNr() + ")");
        } catch (java.io.IOException e) {
            throw new Malformed("body is not UTF-8 JSON");
        }
        if (doc == null || !doc.isObject()) {
            throw new Malformed("body is not a JSON object");
        }
        String payload = text(doc, "payload", false);
        byte[] bytes;
        try {
            bytes = Base64.getDecoder().decode(payload == null ? "" : payload);
        } catch (IllegalArgumentException e) {
            throw new Malformed("field payload: not base64 (" + e.getMessage() + ")");
        }
        return new Submission(text(doc, "award_id", true), text(doc, "submission_timestamp", true), bytes,
                amount(doc), text(doc, "idempotency_key", false));
    }

    private static String text(JsonNode doc, String name, boolean required) throws Malformed {
        JsonNode v = doc.get(name);
        if (v == null || v.isNull()) {
            if (required) {
                throw new Malformed("field " + name + ": missing");
            }
            return null;
        }
        if (!v.isTextual()) {
            throw new Malformed("field " + name + ": must be a string");
        }
        return v.asText();
    }

    private static long amount(JsonNode doc) throws Malformed {
        JsonNode v = doc.get("amount_cents");
        if (v == null || v.isNull()) {
            throw new Malformed("field amount_cents: missing");
        }
        if (v.isTextual() && INTEGER.matcher(v.asText()).matches()) {
            try {
                return Long.parseLong(v.asText());
            } catch (NumberFormatException e) {
                throw new Malformed("field amount_cents: out of the int64 range");
            }
        }
        if (!v.isIntegralNumber() || !v.canConvertToLong()) {
            throw new Malformed("field amount_cents: must be an integer");
        }
        return v.asLong();
    }
}
