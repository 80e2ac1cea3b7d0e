package io.oncegate.client;

/**
 * The ledger row the first delivery wrote. {@code recordedAt}: RFC 3339 UTC
 * with microseconds; {@code sequence}: per award, 1, 2, 3, ... in commit order.
 */
public record Disbursement(String id, String awardId, long amountCents, String recordedAt, long sequence) {}
