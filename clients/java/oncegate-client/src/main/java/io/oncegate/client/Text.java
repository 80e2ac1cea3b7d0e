package io.oncegate.client;

import java.nio.charset.StandardCharsets;

/** UTF-8 as the sidecar sees it: a Java string with an unpaired surrogate has no UTF-8 form. */
final class Text {
    private Text() {}

    /** The index of the first unpaired surrogate, or -1. */
    static int unpairedSurrogate(String s) {
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (Character.isHighSurrogate(c) && i + 1 < s.length() && Character.isLowSurrogate(s.charAt(i + 1))) {
                i++;
            } else if (Character.isSurrogate(c)) {
                return i;
            }
        }
        return -1;
    }

    /** The UTF-8 bytes of {@code s}; an unpaired surrogate (which UTF-8 cannot carry) is refused, naming the field. */
    static byte[] utf8(String field, String s) {
        int at = unpairedSurrogate(s);
        if (at >= 0) {
            throw new IllegalArgumentException(String.format(
                    "%s is not valid Unicode: unpaired surrogate U+%04X at index %d", field, (int) s.charAt(at), at));
        }
        return s.getBytes(StandardCharsets.UTF_8);
    }
}
