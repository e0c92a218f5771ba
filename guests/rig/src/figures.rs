//! What the benchmarks' reports share: the median of repeated measurements. Their tables are
//! written by [`pvmm_scheduler::table::aligned_columns`], in the same format as the
//! simulator's.

/// The median of the measured values of `values` (None marks a measurement that failed);
/// None when none was measured.
pub fn median(values: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    let mut values: Vec<f64> = values.into_iter().flatten().collect();
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if !n.is_multiple_of(2) => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_skip_failed_measurements() {
        assert_eq!(median([Some(3.0), None, Some(1.0)]), Some(2.0));
        assert_eq!(median([Some(1.0), Some(2.0)]), Some(1.5));
        assert_eq!(median([None]), None);
    }
}
