package io.oncegate.client;

/** What {@code Effects.Begin} answered: the lease, or the stored response. */
public sealed interface Begun permits Begun.Acquired, Begun.Completed {
    /**
     * The attempt.
     *
     * @return 1 the first time; more when an earlier attempt was released or expired
     */
    int attempt();

    /**
     * The caller holds the lease: perform the effect (with the same key at the
     * provider), then complete or release. {@code attempt > 1}: an earlier
     * attempt may have reached the provider; ask the provider first.
     */
    record Acquired(String leaseToken, int attempt) implements Begun {}

    /** The effect is done: its stored response. */
    record Completed(byte[] response, String completedAt, int attempt, Decision.Tier decidedBy) implements Begun {}
}
