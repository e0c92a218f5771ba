//! Thrash control for the number of packages in use: up at once, down along
//! a quadratic ramp, as powernv's global pstate ramp-down ("[PATCH v2 2/2]
//! cpufreq: powernv: Ramp-down global pstate slower than local-pstate",
//! Akshay Adiga, linuxppc-dev, 2016-04-23).

/// Thrash control state for the number of packages in use.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Ramp {
    /// Packages in use (0 before the first packing decision).
    active: usize,
    /// When the current ramp-down started.
    start_ms: Option<u64>,
    /// Packages in use when it started.
    from: usize,
    /// Packages needed at the previous decision.
    last_needed: usize,
}

impl Ramp {
    /// Packages to use now, given the packages the load needs.
    pub(super) fn step(&mut self, now_ms: u64, needed: usize, window_ms: u64) -> usize {
        if self.active == 0 || needed >= self.active {
            // First decision, or the load grew: go up at once.
            self.active = needed;
            self.start_ms = None;
        } else {
            if self.start_ms.is_none() || needed > self.last_needed {
                // A ramp starts, or any rise restarts it.
                self.start_ms = Some(now_ms);
                self.from = self.active;
            }
            let elapsed = now_ms.saturating_sub(self.start_ms.unwrap_or(now_ms));
            let span = (self.from - needed) as u128;
            // powernv: ramp_down_percent(t) = t^2 / window^2, in packages.
            let drop = if window_ms == 0 || elapsed >= window_ms {
                span
            } else {
                // Scale huge windows down so span x elapsed^2 fits in u128.
                let shift = 64 - u64::from(u32::MAX).leading_zeros();
                let shift = (64 - window_ms.leading_zeros()).saturating_sub(shift);
                let (e, w) = (
                    u128::from(elapsed >> shift),
                    u128::from(window_ms >> shift).max(1),
                );
                span * e * e / (w * w)
            };
            let target = (self.from as u128 - drop).max(needed as u128) as usize;
            self.active = self.active.min(target);
            if self.active == needed {
                self.start_ms = None;
            }
        }
        self.last_needed = needed;
        self.active
    }

    /// Uses `packages` from now on, as any rise does: at once, and a later
    /// ramp-down starts from there. Spreading over the whole host, and
    /// packing that had to open more packages than the ramp allowed, go up so.
    pub(super) fn up_at_once(&mut self, packages: usize) {
        self.active = packages;
        self.start_ms = None;
        self.last_needed = packages;
    }

    /// Uses at least `packages` from now on (as [`Ramp::up_at_once`] when that is more than
    /// in use now).
    pub(super) fn raise_to(&mut self, packages: usize) {
        if packages > self.active {
            self.up_at_once(packages);
        }
    }
}
