package io.oncegate.client;

/**
 * A duration as the sidecar's error messages print it (Rust's
 * {@code humantime::format_duration}): "15m 1s", "1h 2m 3s 4ms 5us 6ns",
 * "1year 1month 4days 7h 26m 24s" (a year is 365.25 days, a month 30.44).
 */
final class HumanDuration {
    private HumanDuration() {}

    static String format(long seconds, int nanos) {
        if (seconds == 0 && nanos == 0) {
            return "0s";
        }
        long years = seconds / 31_557_600L;
        long ydays = seconds % 31_557_600L;
        long months = ydays / 2_630_016L;
        long mdays = ydays % 2_630_016L;
        long days = mdays / 86_400L;
        long daySecs = mdays % 86_400L;
        StringBuilder out = new StringBuilder();
        plural(out, "year", years);
        plural(out, "month", months);
        plural(out, "day", days);
        item(out, "h", daySecs / 3600);
        item(out, "m", daySecs % 3600 / 60);
        item(out, "s", daySecs % 60);
        item(out, "ms", nanos / 1_000_000);
        item(out, "us", nanos / 1000 % 1000);
        item(out, "ns", nanos % 1000);
        return out.toString();
    }

    private static void plural(StringBuilder out, String name, long value) {
        item(out, value > 1 ? name + "s" : name, value);
    }

    private static void item(StringBuilder out, String name, long value) {
        if (value > 0) {
            if (out.length() > 0) {
                out.append(' ');
            }
            out.append(value).append(name);
        }
    }
}
