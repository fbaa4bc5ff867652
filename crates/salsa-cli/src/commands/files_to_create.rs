//! The files a command is about to create, so that a failure removes them again: `format`
//! and `serve` (members given with a size, a parity buffer) and `device replace` (the new
//! member). It removes only what did not exist before the command ran.

use crate::DeviceSpec;

/// The files a command that creates a pool is about to create (members given with a size and
/// not there yet, and a missing parity buffer, which is created at the size the layout needs),
/// so that a failure removes them again and leaves nothing behind.
pub(crate) struct FilesToCreate(Vec<std::path::PathBuf>);

impl FilesToCreate {
    pub(crate) fn of(members: &[DeviceSpec], parity_buffer: Option<&DeviceSpec>) -> FilesToCreate {
        let sized_members = members.iter().filter(|s| s.size_bytes.is_some());
        FilesToCreate(
            sized_members
                .chain(parity_buffer)
                .filter(|s| s.is_missing())
                .map(|s| s.path.clone())
                .collect(),
        )
    }

    /// Removes them (after a failure, `error`, which it returns).
    pub(crate) fn remove(&self, error: String) -> String {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
        error
    }
}
