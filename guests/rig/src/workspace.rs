//! The workspace the rig builds in and its output folder, `guests/out/`.

use std::path::{Path, PathBuf};

use crate::error::{io_err, ImageError};

/// The workspace and its output folder.
#[derive(Debug, Clone)]
pub struct Workspace {
    /// The workspace root (holds the top-level Cargo.toml).
    pub root: PathBuf,
    /// `guests/out`, where everything built goes.
    pub out: PathBuf,
}

impl Workspace {
    /// The workspace this crate was compiled in.
    pub fn locate() -> Result<Workspace, ImageError> {
        let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let root = manifest_dir
            .parent()
            .and_then(Path::parent)
            .filter(|root| root.join("Cargo.toml").is_file())
            .ok_or_else(|| ImageError::NoWorkspace(manifest_dir.clone()))?
            .to_path_buf();
        let out = root.join("guests").join("out");
        Ok(Workspace { root, out })
    }

    /// `guests/out/<name>`, created when missing.
    pub(crate) fn dir(&self, name: &str) -> Result<PathBuf, ImageError> {
        let dir = self.out.join(name);
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        Ok(dir)
    }

    /// Cargo's target directory: `CARGO_TARGET_DIR` when set, else `<root>/target`.
    pub fn target_dir(&self) -> PathBuf {
        match std::env::var_os("CARGO_TARGET_DIR") {
            Some(dir) => {
                let dir = PathBuf::from(dir);
                if dir.is_absolute() {
                    dir
                } else {
                    std::env::current_dir().unwrap_or_default().join(dir)
                }
            }
            None => self.root.join("target"),
        }
    }
}
