//! Usage decay with a half-life (Slurm's `PriorityDecayHalfLife`): the state machine charges finished jobs with
//! it and the scheduler ages usage with it, so both must compute exactly the same numbers.

/// Usage decayed over `elapsed_s` with the given half-life: `usage * 2^(-elapsed/half_life)`.
/// A zero half-life turns decay off (Slurm's `PriorityDecayHalfLife=0`): usage is kept as is.
pub fn decay(usage: f64, elapsed_s: u64, half_life_s: u64) -> f64 {
    if half_life_s == 0 || elapsed_s == 0 {
        return usage;
    }
    usage * (-(elapsed_s as f64) / half_life_s as f64).exp2()
}

/// GPU-seconds of `gpus` GPUs busy over `[start_s, end_s]`, each second decayed to `now_s` (`now_s >= end_s`):
/// `g * H/ln2 * (2^(-(now-end)/H) - 2^(-(now-start)/H))`, exactly `g * (end - start)` when `H = 0` (no decay).
///
/// Usage accrued at time `s` has decayed by `now - s`, so the closed form of the integral makes a charge
/// independent of how often it is taken (one 1-hour step equals sixty 1-minute steps, and a ten-day job charged at
/// its end counts its first days at their decayed weight).
pub fn decayed_usage(gpus: f64, start_s: u64, end_s: u64, now_s: u64, half_life_s: u64) -> f64 {
    let span_s = end_s.saturating_sub(start_s);
    let since_end_s = now_s.saturating_sub(end_s.max(start_s));
    if half_life_s == 0 {
        return gpus * span_s as f64;
    }
    let h = half_life_s as f64;
    // 2^(-a/h) - 2^(-(a+s)/h) = 2^(-a/h) * -expm1(-s ln2 / h): expm1 keeps precision when s << h, where the
    // difference of two nearly equal powers would cancel.
    let tail = (-(since_end_s as f64) / h).exp2();
    gpus * h / std::f64::consts::LN_2 * tail * -(-(span_s as f64) * std::f64::consts::LN_2 / h).exp_m1()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_halves_every_half_life_and_zero_turns_decay_off() {
        assert_eq!(decay(100.0, 3_600, 3_600), 50.0);
        assert_eq!(decay(100.0, 7_200, 3_600), 25.0);
        assert_eq!(decay(100.0, 7_200, 0), 100.0);
        assert_eq!(decayed_usage(4.0, 10, 110, 500, 0), 400.0);
    }

    #[test]
    fn charging_in_steps_equals_charging_at_once() {
        let h = 86_400;
        let once = decayed_usage(8.0, 0, 36_000, 36_000, h);
        let mut stepped = 0.0;
        for step in 0..60 {
            stepped = decay(stepped, 600, h) + decayed_usage(8.0, step * 600, (step + 1) * 600, (step + 1) * 600, h);
        }
        assert!((once - stepped).abs() < 1e-6 * once, "{once} vs {stepped}");
        // Decay during the span leaves less than the raw GPU-seconds.
        assert!(once < 8.0 * 36_000.0);
    }

    #[test]
    fn a_short_span_under_a_long_half_life_keeps_its_precision() {
        // One GPU-second under a 10-year half-life: the naive difference of powers loses most digits.
        let h = 10 * 365 * 86_400;
        let usage = decayed_usage(1.0, 0, 1, 1, h);
        // (1 - e^-x) / x with x = ln2 / h, by its series.
        let x = std::f64::consts::LN_2 / h as f64;
        assert!((usage - (1.0 - x / 2.0 + x * x / 6.0)).abs() < 1e-15, "{usage}");
    }
}
