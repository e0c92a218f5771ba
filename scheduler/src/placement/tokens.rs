//! Migration tokens: a token bucket per vCPU bounds how often it moves.
//!
//! The bucket holds at most `limit` moves
//! ([`super::EngineConfig::max_migrations_per_vcpu_per_s`]) and refills
//! continuously at `limit` moves per second. A full bucket allows `limit`
//! moves at once; over any span of `T` seconds a vCPU moves at most
//! `limit x (1 + T)` times, so at `limit` = 2 at most 3 moves fall within any
//! one second and the long-run rate is 2 per second. A vCPU without a whole
//! token stays where it is, whatever the policy wants.

/// Token cost of one migration in the bucket's fixed-point units: a bucket
/// refills by `limit` units per millisecond, one move per `1000 / limit` ms.
const TOKEN: u64 = 1000;

/// One vCPU's migration tokens.
#[derive(Debug, Clone, Copy)]
pub(super) struct TokenBucket {
    /// Tokens x [`TOKEN`].
    tokens: u64,
    /// When `tokens` was last refilled.
    refill_ms: u64,
}

impl TokenBucket {
    /// A full bucket for `limit` moves per second, at `now_ms`.
    pub(super) fn full(limit: u32, now_ms: u64) -> Self {
        TokenBucket {
            tokens: u64::from(limit) * TOKEN,
            refill_ms: now_ms,
        }
    }

    /// Adds the tokens earned since the last refill, up to a full bucket.
    pub(super) fn refill(&mut self, now_ms: u64, limit: u32) {
        let limit = u64::from(limit);
        let elapsed = now_ms.saturating_sub(self.refill_ms);
        self.tokens = self
            .tokens
            .saturating_add(elapsed.saturating_mul(limit))
            .min(limit * TOKEN);
        self.refill_ms = self.refill_ms.max(now_ms);
    }

    /// Whether a move is allowed now.
    pub(super) fn has_token(&self) -> bool {
        self.tokens >= TOKEN
    }

    /// Pays for one move.
    pub(super) fn spend(&mut self) {
        self.tokens = self.tokens.saturating_sub(TOKEN);
    }
}
