//! `apm generate` (hidden): what the package installs beside the binary, generated from
//! the program's own definitions so that it cannot drift from them: the manual pages
//! (apm(8) and one page per subcommand, from the command line's clap definition;
//! apm.toml(5) from the configuration's schema, `apm::config::reference`), the shell
//! completions (bash, zsh, fish) and the commented default configuration.
//! `cargo xtask deb` runs it.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// What to generate.
#[derive(Debug, clap::Subcommand)]
pub enum Generate {
    /// The manual pages into DIR: apm.8, apm-SUBCOMMAND.8 ..., apm.toml.5.
    Man {
        /// The directory (created when missing).
        dir: PathBuf,
    },
    /// The shell completions into DIR: apm.bash, _apm (zsh), apm.fish.
    Completions {
        /// The directory (created when missing).
        dir: PathBuf,
    },
    /// The commented default configuration (every key at its default) into FILE.
    Config {
        /// The file.
        file: PathBuf,
    },
}

/// Run `apm generate`; `cli` is the command line's definition.
pub fn run(what: Generate, cli: clap::Command) -> Result<()> {
    match what {
        Generate::Man { dir } => man(cli, &dir),
        Generate::Completions { dir } => completions(cli, &dir),
        Generate::Config { file } => write(&file, apm::config::reference::default_file()),
    }
}

fn write(path: &Path, text: impl AsRef<[u8]>) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

fn make_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))
}

/// apm(8), a page per visible subcommand (apm-run(8), apm-mad-decode(8) ...), and
/// apm.toml(5).
fn man(cli: clap::Command, dir: &Path) -> Result<()> {
    make_dir(dir)?;
    let mut cli = cli.disable_help_subcommand(true);
    cli.build();
    let version = cli.get_version().unwrap_or_default().to_owned();
    let mut pending = vec![cli];
    while let Some(cmd) = pending.pop() {
        pending.extend(cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned());
        let page = clap_mangen::Man::new(cmd)
            .section("8")
            .manual("System Administration")
            .source(format!("apm {version}"));
        let mut roff = Vec::new();
        page.render(&mut roff)?;
        write(&dir.join(page.get_filename()), roff)?;
    }
    write(
        &dir.join("apm.toml.5"),
        apm::config::reference::man_page(&version),
    )
}

fn completions(mut cli: clap::Command, dir: &Path) -> Result<()> {
    use clap_complete::Shell;
    make_dir(dir)?;
    for (shell, file) in [
        (Shell::Bash, "apm.bash"),
        (Shell::Zsh, "_apm"),
        (Shell::Fish, "apm.fish"),
    ] {
        let mut text = Vec::new();
        clap_complete::generate(shell, &mut cli, "apm", &mut text);
        write(&dir.join(file), text)?;
    }
    Ok(())
}
