//! The one writer of text tables: `pvmm-ctl`'s and `pvmm-host status`'s, the simulator's
//! results tables and the rig's benchmark and soak reports.
//!
//! It lives in this crate because every program that prints a table depends on it already
//! (`pvmm-api`, `pvmm-host`, `pvmm-sim`, `pvmm-rig`), so none needs another dependency. A table
//! is a header row and rows of cells, each column as wide as its widest cell, counted in
//! characters (a `≤` is one). Two layouts:
//!
//! - [`columns`]: columns two spaces apart from the margin, no trailing spaces (what people
//!   read in a terminal);
//! - [`piped`]: every cell between `|`s, as a Markdown table's rows are written.

use std::fmt::Write as _;

/// Where a column's cells sit in its width.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Against its left edge (names, text).
    Left,
    /// Against its right edge (numbers).
    Right,
}

/// Every column left-aligned.
pub const LEFT: &[Align] = &[Align::Left];
/// The results tables' alignment: the row's name left, the numbers after it right.
pub const NAME_THEN_NUMBERS: &[Align] = &[Align::Left, Align::Right];

/// `headers` and `rows` in columns two spaces apart, aligned by `align` (the first column's,
/// the second's, ...; the last one given holds for the columns after it), with no trailing
/// spaces. A row shorter than the header leaves its last columns empty.
pub fn columns<H, R, C>(align: &[Align], headers: &[H], rows: &[R]) -> String
where
    H: AsRef<str>,
    R: AsRef<[C]>,
    C: AsRef<str>,
{
    let widths = widths(headers, rows);
    let mut out = String::new();
    for_each_line(headers, rows, |cells| {
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            pad(&mut line, cell, widths[i], align_of(align, i));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    });
    out
}

/// The results tables' layout ([`NAME_THEN_NUMBERS`] in [`columns`]): the simulator's and the
/// rig's benchmarks'.
pub fn aligned_columns<H, R, C>(headers: &[H], rows: &[R]) -> String
where
    H: AsRef<str>,
    R: AsRef<[C]>,
    C: AsRef<str>,
{
    columns(NAME_THEN_NUMBERS, headers, rows)
}

/// `headers` and `rows` as `| a | b |` lines, aligned by `align` as in [`columns`].
pub fn piped<H, R, C>(align: &[Align], headers: &[H], rows: &[R]) -> String
where
    H: AsRef<str>,
    R: AsRef<[C]>,
    C: AsRef<str>,
{
    let widths = widths(headers, rows);
    let mut out = String::new();
    for_each_line(headers, rows, |cells| {
        out.push('|');
        for (i, cell) in cells.iter().enumerate() {
            out.push(' ');
            pad(&mut out, cell, widths[i], align_of(align, i));
            out.push_str(" |");
        }
        out.push('\n');
    });
    out
}

/// Calls `line` with the header's cells, then each row's, every row as many cells as the
/// header (the missing ones empty, the extra ones left out).
fn for_each_line<H, R, C>(headers: &[H], rows: &[R], mut line: impl FnMut(&[&str]))
where
    H: AsRef<str>,
    R: AsRef<[C]>,
    C: AsRef<str>,
{
    let header: Vec<&str> = headers.iter().map(AsRef::as_ref).collect();
    line(&header);
    for row in rows {
        let row = row.as_ref();
        let cells: Vec<&str> = (0..headers.len())
            .map(|i| row.get(i).map_or("", AsRef::as_ref))
            .collect();
        line(&cells);
    }
}

/// Each column's width: its widest cell, header included, in characters.
fn widths<H, R, C>(headers: &[H], rows: &[R]) -> Vec<usize>
where
    H: AsRef<str>,
    R: AsRef<[C]>,
    C: AsRef<str>,
{
    let mut widths: Vec<usize> = headers.iter().map(|h| h.as_ref().chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row.as_ref()) {
            *w = (*w).max(cell.as_ref().chars().count());
        }
    }
    widths
}

/// Column `i`'s alignment in `align`.
fn align_of(align: &[Align], i: usize) -> Align {
    align
        .get(i)
        .or(align.last())
        .copied()
        .unwrap_or(Align::Left)
}

/// Appends `cell` padded to `width` characters.
fn pad(out: &mut String, cell: &str, width: usize, align: Align) {
    let _ = match align {
        Align::Left => write!(out, "{cell:<width$}"),
        Align::Right => write!(out, "{cell:>width$}"),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_to_their_widest_cell_in_characters() {
        let headers = ["Policy", "Idle(%)"];
        let rows = [["performance", "1.00"], ["bound", "≤0.5"]];
        assert_eq!(
            aligned_columns(&headers, &rows),
            "Policy       Idle(%)\nperformance     1.00\nbound           ≤0.5\n"
        );
    }

    #[test]
    fn left_columns_leave_no_trailing_spaces_and_short_rows_end_early() {
        let rows = vec![
            vec!["0".to_string(), "101".to_string()],
            vec!["12".to_string()],
        ];
        assert_eq!(
            columns(LEFT, &["vcpu", "tid", "state"], &rows),
            "vcpu  tid  state\n0     101\n12\n"
        );
    }

    #[test]
    fn piped_rows_frame_every_cell() {
        let align = [Align::Left, Align::Right];
        assert_eq!(
            piped(&align, &["variant", "boots"], &[["pvmm", "12"]]),
            "| variant | boots |\n| pvmm    |    12 |\n"
        );
    }
}
