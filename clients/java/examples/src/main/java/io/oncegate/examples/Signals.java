package io.oncegate.examples;

import sun.misc.Signal;

/**
 * SIGTERM and SIGINT as a request to stop, not an exit: the JVM's own
 * handling exits 143 through shutdown hooks while the loop may still hold a
 * message; this lets the loop finish it, commit, leave the group and exit 0.
 */
final class Signals {
    private Signals() {}

    static void onTermination(Runnable stop) {
        for (String name : new String[] {"TERM", "INT"}) {
            Signal.handle(new Signal(name), s -> stop.run());
        }
    }
}
