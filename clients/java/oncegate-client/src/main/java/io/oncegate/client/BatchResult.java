package io.oncegate.client;

/** One item of a {@code submitBatch}: its decision, or its error (never both). */
public record BatchResult(Decision decision, GateException error) {
    public boolean isDecided() {
        return decision != null;
    }
}
