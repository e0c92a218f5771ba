//! What the benchmarks' reports share: the median of repeated measurements, and tables of
//! columns aligned to their widest cell.

use std::fmt::Write as _;

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

/// `headers` and `rows` as lines of columns two spaces apart, each as wide as its widest
/// cell: the first column left-aligned, the others right-aligned, no trailing spaces.
pub fn aligned_columns<const N: usize>(headers: &[String; N], rows: &[[String; N]]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(String::len).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    for cells in std::iter::once(headers).chain(rows) {
        let mut line = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i == 0 {
                let _ = write!(line, "{cell:<w$}");
            } else {
                let _ = write!(line, "  {cell:>w$}");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
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

    #[test]
    fn columns_align_to_their_widest_cell() {
        let headers = ["Policy".to_string(), "Time".to_string()];
        let rows = [["performance".to_string(), "1.00".to_string()]];
        assert_eq!(
            aligned_columns(&headers, &rows),
            "Policy       Time\nperformance  1.00\n"
        );
    }
}
