//! What the benchmarks' reports share: the median of repeated measurements, and the one table
//! writer ([`table`]) every benchmark's tables go through.

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

/// `headers` and `rows` as aligned columns, the first left-aligned and the rest right-aligned:
/// the simulator's format ([`pvmm_scheduler::table::aligned_columns`]), so the rig's tables
/// and the simulator's read alike and change together.
pub fn table<const N: usize>(headers: [&str; N], rows: &[[String; N]]) -> String {
    pvmm_scheduler::table::aligned_columns(&headers.map(String::from), rows)
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
