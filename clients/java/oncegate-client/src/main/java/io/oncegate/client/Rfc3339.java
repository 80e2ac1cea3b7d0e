package io.oncegate.client;

/**
 * RFC 3339 §5.6 {@code date-time}, exactly as the sidecar reads it, on the
 * UTF-8 bytes: {@code YYYY-MM-DD} {@code T|t} {@code hh:mm:ss} [{@code .}
 * digits] ({@code Z|z|±hh:mm}), real calendar dates (leap years), a leap
 * second only in a minute's last second ({@code :59:60}).
 */
final class Rfc3339 {
    private Rfc3339() {}

    static boolean isDateTime(byte[] b) {
        int year = digits(b, 0, 4), month = digits(b, 5, 7), day = digits(b, 8, 10);
        int hour = digits(b, 11, 13), minute = digits(b, 14, 16), second = digits(b, 17, 19);
        if (year < 0 || month < 0 || day < 0 || hour < 0 || minute < 0 || second < 0) {
            return false;
        }
        if (b[4] != '-' || b[7] != '-' || (b[10] != 'T' && b[10] != 't') || b[13] != ':' || b[16] != ':') {
            return false;
        }
        boolean leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
        int days;
        switch (month) {
            case 1: case 3: case 5: case 7: case 8: case 10: case 12:
                days = 31;
                break;
            case 4: case 6: case 9: case 11:
                days = 30;
                break;
            case 2:
                days = leap ? 29 : 28;
                break;
            default:
                return false;
        }
        if (day < 1 || day > days || hour > 23 || minute > 59 || second > 60 || (second == 60 && minute != 59)) {
            return false;
        }
        int i = 19;
        if (i < b.length && b[i] == '.') {
            int start = ++i;
            while (i < b.length && isDigit(b[i])) {
                i++;
            }
            if (i == start) {
                return false;
            }
        }
        int rest = b.length - i;
        if (rest == 1) {
            return b[i] == 'Z' || b[i] == 'z';
        }
        if (rest == 6 && (b[i] == '+' || b[i] == '-') && b[i + 3] == ':') {
            int h = digits(b, i + 1, i + 3), m = digits(b, i + 4, i + 6);
            return h >= 0 && h <= 23 && m >= 0 && m <= 59;
        }
        return false;
    }

    /** The decimal value of b[from..to), or -1 when out of range or not all ASCII digits. */
    private static int digits(byte[] b, int from, int to) {
        if (to > b.length) {
            return -1;
        }
        int n = 0;
        for (int i = from; i < to; i++) {
            if (!isDigit(b[i])) {
                return -1;
            }
            n = n * 10 + (b[i] - '0');
        }
        return n;
    }

    private static boolean isDigit(byte c) {
        return c >= '0' && c <= '9';
    }
}
