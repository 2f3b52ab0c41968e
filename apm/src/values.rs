//! Command-line values that later code turns into durations and counts: parsed here and
//! refused with the argument's own words, so that nothing downstream (such as
//! `Duration::from_secs_f64`, which panics on NaN, infinity or overflow) sees a value
//! it cannot hold. Only parsing lives here.

/// The longest time any `apm` option accepts: about 31 years, far below what a
/// `Duration` or an `Instant` can add without overflow.
pub const MAX_SECONDS: f64 = 1e9;

/// A finite, non-negative number of seconds, at most [`MAX_SECONDS`].
pub fn seconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=MAX_SECONDS).contains(&v) => Ok(v),
        Ok(v) if v.is_finite() && v > MAX_SECONDS => Err(format!(
            "{s:?} seconds is more than the limit of {MAX_SECONDS:e} seconds"
        )),
        _ => Err(format!(
            "{s:?} is not a number of seconds (a finite number, 0 or more)"
        )),
    }
}

/// A finite, positive number of milliseconds, at most [`MAX_SECONDS`] in seconds.
pub fn milliseconds(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v / 1e3 <= MAX_SECONDS => Ok(v),
        Ok(v) if v.is_finite() && v > 0.0 => Err(format!(
            "{s:?} ms is more than the limit of {MAX_SECONDS:e} seconds"
        )),
        _ => Err(format!(
            "{s:?} is not a number of milliseconds (a finite number above 0)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_would_panic_a_duration_is_refused() {
        for bad in ["nan", "NaN", "inf", "-inf", "1e300", "-1", "", "x"] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
        assert_eq!(seconds("2.5"), Ok(2.5));
        assert_eq!(seconds("0"), Ok(0.0));
        assert!(seconds("1e300").unwrap_err().contains("limit"));
        for bad in ["nan", "inf", "0", "-3", "1e300"] {
            assert!(milliseconds(bad).is_err(), "{bad}");
        }
        assert_eq!(milliseconds("0.5"), Ok(0.5));
        // Every accepted value makes a Duration.
        let _ = std::time::Duration::from_secs_f64(seconds("1e9").expect("max"));
    }
}
