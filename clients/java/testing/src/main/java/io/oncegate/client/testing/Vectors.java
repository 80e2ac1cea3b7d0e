package io.oncegate.client.testing;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.oncegate.client.Submission;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;

/** The shared vectors under the repository's {@code clients/vectors/}. */
public final class Vectors {
    private Vectors() {}

    private static JsonNode read(String file) {
        try {
            return new ObjectMapper().readTree(Sidecar.repo().resolve(Path.of("clients", "vectors", file)).toFile());
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** {@code {field}_b64} repeated {@code {field}_repeat} times. */
    public static byte[] body(JsonNode doc, String field) {
        byte[] unit = Base64.getDecoder().decode(doc.path(field + "_b64").asText(""));
        int repeat = doc.path(field + "_repeat").asInt(1);
        byte[] out = new byte[unit.length * repeat];
        for (int i = 0; i < repeat; i++) {
            System.arraycopy(unit, 0, out, i * unit.length, unit.length);
        }
        return out;
    }

    public static Submission submission(JsonNode doc) {
        JsonNode key = doc.get("idempotency_key");
        return new Submission(doc.get("award_id").asText(), doc.get("submission_timestamp").asText(),
                body(doc, "payload"), Long.parseLong(doc.get("amount_cents").asText()),
                key == null ? null : key.asText());
    }

    public static List<JsonNode> keys() {
        List<JsonNode> out = new ArrayList<>();
        read("keys.json").get("keys").forEach(out::add);
        return out;
    }

    public static List<JsonNode> rejections() {
        List<JsonNode> out = new ArrayList<>();
        read("rejections.json").get("rejections").forEach(out::add);
        return out;
    }
}
