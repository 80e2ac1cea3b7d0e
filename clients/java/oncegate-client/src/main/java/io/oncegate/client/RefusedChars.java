package io.oncegate.client;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The characters an award id may not contain, and those it may not begin or
 * end with, as the <em>server's</em> Unicode tables have them: read from
 * {@code refused_chars.json} (the repository's {@code clients/vectors/},
 * written from the server's own table), not from this JVM's
 * {@link Character} data, whose Unicode version depends on the runtime.
 */
final class RefusedChars {
    private static final Pattern RANGE =
            Pattern.compile("\\[\"([0-9A-F]{4,6})\", \"([0-9A-F]{4,6})\"(?:, \"([a-z -]+)\")?\\]");
    private static final RefusedChars TABLE = load();

    private final int[] firsts;
    private final int[] lasts;
    private final String[] names;
    private final int[] whiteFirsts;
    private final int[] whiteLasts;
    final String unicodeVersion;

    private RefusedChars(List<String[]> refused, List<String[]> white, String unicodeVersion) {
        firsts = refused.stream().mapToInt(r -> Integer.parseInt(r[0], 16)).toArray();
        lasts = refused.stream().mapToInt(r -> Integer.parseInt(r[1], 16)).toArray();
        names = refused.stream().map(r -> r[2]).toArray(String[]::new);
        whiteFirsts = white.stream().mapToInt(r -> Integer.parseInt(r[0], 16)).toArray();
        whiteLasts = white.stream().mapToInt(r -> Integer.parseInt(r[1], 16)).toArray();
        this.unicodeVersion = unicodeVersion;
    }

    /** Why an award id may not contain code point {@code cp} (the error message's words), or null. */
    static String refusal(int cp) {
        int i = find(TABLE.firsts, TABLE.lasts, cp);
        return i < 0 ? null : TABLE.names[i];
    }

    /** Unicode White_Space: not allowed first or last in an award id. */
    static boolean isWhiteSpace(int cp) {
        return find(TABLE.whiteFirsts, TABLE.whiteLasts, cp) >= 0;
    }

    static String unicodeVersion() {
        return TABLE.unicodeVersion;
    }

    private static int find(int[] firsts, int[] lasts, int cp) {
        int i = Arrays.binarySearch(firsts, cp);
        if (i < 0) {
            i = -i - 2; // the range starting before cp
        }
        return i >= 0 && cp <= lasts[i] ? i : -1;
    }

    private static RefusedChars load() {
        String json;
        try (InputStream in = RefusedChars.class.getResourceAsStream("refused_chars.json")) {
            if (in == null) {
                throw new IllegalStateException("refused_chars.json missing from the oncegate-client jar");
            }
            json = new String(in.readAllBytes(), StandardCharsets.UTF_8);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        int white = json.indexOf("\"white_space\"");
        Matcher version = Pattern.compile("\"unicode_version\": \"([0-9.]+)\"").matcher(json);
        if (white < 0 || !version.find()) {
            throw new IllegalStateException("refused_chars.json: no white_space or unicode_version");
        }
        List<String[]> refused = ranges(json.substring(0, white));
        List<String[]> whiteSpace = ranges(json.substring(white));
        if (refused.isEmpty() || whiteSpace.isEmpty()) {
            throw new IllegalStateException("refused_chars.json: no ranges");
        }
        return new RefusedChars(refused, whiteSpace, version.group(1));
    }

    private static List<String[]> ranges(String json) {
        List<String[]> out = new ArrayList<>();
        Matcher m = RANGE.matcher(json);
        while (m.find()) {
            out.add(new String[] {m.group(1), m.group(2), m.group(3)});
        }
        return out;
    }
}
