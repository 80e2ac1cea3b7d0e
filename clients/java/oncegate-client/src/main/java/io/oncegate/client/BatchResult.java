package io.oncegate.client;

/**
 * One item of a {@link GateClient#submitBatch}: its decision, or its error (never both).
 *
 * @param decision the item's decision, or null when it failed
 * @param error the item's error (as {@link GateClient#submit(Submission)} would have thrown it),
 *     or null when it was decided
 */
public record BatchResult(Decision decision, GateException error) {
    /**
     * Whether the item was decided (acknowledge its message).
     *
     * @return {@code decision != null}
     */
    public boolean isDecided() {
        return decision != null;
    }
}
