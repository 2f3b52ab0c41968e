//! A simulator scenario file as every part of apm reads it (`apm simulate --scenario`,
//! `apm watch --sim --scenario`, a deployment's `[sim] scenario`, `apm config check`):
//! bounded by [`crate::input::SCENARIO_LIMIT`], and refused with every problem, each
//! prefixed by the file's name, its line and column, and its key.

use crate::input::{InputError, SCENARIO_LIMIT};
use provider_sim::config::Problems;
use provider_sim::{Scenario, ScenarioError};
use std::path::Path;

/// Why a scenario file cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioFileError {
    /// It cannot be read (missing, unreadable, over the size limit, not text); the
    /// message names the file.
    #[error(transparent)]
    Read(#[from] InputError),
    /// What it says cannot be: every problem, one a line, each `FILE:line L, column C:
    /// KEY: what`.
    #[error("{} problem(s) in {path}:\n{}", problems.len(), Located(path, problems))]
    Invalid {
        /// The file.
        path: String,
        /// Every problem, in file order.
        problems: Problems,
    },
}

/// Problems one a line, each after the file's name.
struct Located<'a>(&'a str, &'a Problems);

impl std::fmt::Display for Located<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, p) in self.1.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}:{p}", self.0)?;
        }
        Ok(())
    }
}

/// Read and parse the scenario at `path`.
pub fn read(path: &Path) -> Result<Scenario, ScenarioFileError> {
    let text = crate::input::read_file(path, SCENARIO_LIMIT, "a scenario file")?;
    Scenario::from_toml(&text).map_err(|e: ScenarioError| ScenarioFileError::Invalid {
        path: path.display().to_string(),
        problems: e.into_problems(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_problem_is_shown_with_the_file_line_column_and_key() {
        let dir = std::env::temp_dir().join(format!("apm-scenario-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("bad.toml");
        std::fs::write(&path, "duration_ms = 0\n[fabric]\nack_timeout = 40\n").expect("write");
        let e = read(&path).expect_err("invalid").to_string();
        let p = path.display();
        assert_eq!(
            e,
            format!(
                "2 problem(s) in {p}:\n\
                 {p}:line 1, column 15: duration_ms: 0 ms: nothing to simulate\n\
                 {p}:line 3, column 15: fabric.ack_timeout: 40: use 1..=31 (4.096 us x 2^t)"
            )
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
