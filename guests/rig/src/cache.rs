//! Skipping build steps whose outputs are newer than their inputs.

use std::path::Path;
use std::time::SystemTime;

use crate::error::{io_err, ImageError};

fn mtime(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Whether `output` exists and is newer than every input (missing inputs count as newer).
pub(crate) fn up_to_date(output: &Path, inputs: &[&Path]) -> bool {
    let Some(out_time) = mtime(output) else {
        return false;
    };
    inputs
        .iter()
        .all(|input| mtime(input).is_some_and(|t| t <= out_time))
}

/// Copies `from` to `to` unless `to` is newer.
pub(crate) fn copy_if_newer(from: &Path, to: &Path) -> Result<(), ImageError> {
    if !up_to_date(to, &[from]) {
        std::fs::copy(from, to).map_err(io_err(to))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn up_to_date_needs_output_newer_than_inputs() {
        let dir = std::env::temp_dir().join(format!("pvmm-rig-utd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let input = dir.join("in");
        let output = dir.join("out");
        std::fs::write(&input, b"x").unwrap();
        assert!(!up_to_date(&output, &[&input]));
        std::fs::write(&output, b"y").unwrap();
        assert!(up_to_date(&output, &[&input]));
        assert!(!up_to_date(&output, &[&dir.join("missing")]));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
