//! `narad user create`, `narad user list`, `narad user password` and `narad user delete`: the
//! users Kafka clients authenticate as (`narad serve --kafka-sasl required`).
//!
//! The password is read from a file (or stdin with `-`), salted and hashed here, and only the
//! SCRAM credentials are sent: the daemon, the network and the metadata never see it.

use std::io::Read as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Args, Subcommand};

use super::ClientArgs;
use super::{human, table};
use narad_host::api::users::{CreateUser, MAX_PASSWORD_BYTES, Secret, UserInfo};
use narad_host::scram::{self, Mechanism, ScramCredential};

/// `narad user`.
#[derive(Debug, Args)]
pub struct UserArgs {
    /// Daemon and output options.
    #[command(flatten)]
    pub client: ClientArgs,
    /// The user command.
    #[command(subcommand)]
    pub command: UserCommand,
}

/// User commands.
#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Create a user with a password (SCRAM-SHA-256 and SCRAM-SHA-512; PLAIN checks the same
    /// credential).
    Create {
        /// The name: 1 to 128 of ASCII letters, digits and `. _ - @`.
        name: String,
        /// Where the password comes from.
        #[command(flatten)]
        password: PasswordArgs,
    },
    /// List the users (names, mechanisms, when created and when the password last changed).
    List,
    /// Give a user a new password. Connections already authenticated stay open; new ones need
    /// the new password.
    Password {
        /// The user.
        name: String,
        /// Where the password comes from.
        #[command(flatten)]
        password: PasswordArgs,
    },
    /// Delete a user. Connections already authenticated stay open until they close.
    Delete {
        /// The user.
        name: String,
    },
}

/// Where the password comes from and how it is salted.
#[derive(Debug, Args)]
pub struct PasswordArgs {
    /// File holding the password (one trailing newline is dropped); `-` reads stdin.
    #[arg(long, value_name = "FILE")]
    password_file: PathBuf,
    /// PBKDF2 iterations of the salted credentials, 4096 to 16384.
    #[arg(long, default_value_t = scram::DEFAULT_ITERATIONS)]
    iterations: u32,
}

impl PasswordArgs {
    /// The salted credentials, one per SCRAM mechanism.
    fn credentials(&self) -> anyhow::Result<Vec<ScramCredential>> {
        let password = read_password(&self.password_file)?;
        Mechanism::ALL
            .iter()
            .map(|&m| {
                ScramCredential::new(m, password.as_bytes(), self.iterations)
                    .with_context(|| format!("cannot make a {m} credential"))
            })
            .collect()
    }
}

/// Reads a password from `path` (`-`: stdin), without one trailing newline.
pub(crate) fn read_password(path: &Path) -> anyhow::Result<String> {
    let mut bytes = Vec::new();
    let limit = u64::try_from(MAX_PASSWORD_BYTES + 2).unwrap_or(u64::MAX);
    if path == Path::new("-") {
        std::io::stdin()
            .take(limit)
            .read_to_end(&mut bytes)
            .context("reading the password from stdin")?;
    } else {
        std::fs::File::open(path)
            .and_then(|f| f.take(limit).read_to_end(&mut bytes))
            .with_context(|| format!("reading the password file {}", path.display()))?;
    }
    let mut text = String::from_utf8(bytes).context("the password is not UTF-8")?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        anyhow::bail!("the password in {} is empty", path.display());
    }
    if text.len() > MAX_PASSWORD_BYTES {
        anyhow::bail!("the password is longer than {MAX_PASSWORD_BYTES} bytes");
    }
    Ok(text)
}

/// Runs a user command.
pub async fn run(args: UserArgs) -> anyhow::Result<()> {
    let client = args.client.client()?;
    let json = args.client.json;
    match args.command {
        UserCommand::Create { name, password } => {
            let request = CreateUser {
                name,
                secret: Secret {
                    password: None,
                    credentials: Some(password.credentials()?),
                },
            };
            let user = client.create_user(&request).await?;
            print_one(&user, json, "created")?;
        }
        UserCommand::Password { name, password } => {
            let secret = Secret {
                password: None,
                credentials: Some(password.credentials()?),
            };
            let user = client.set_user_credentials(&name, &secret).await?;
            print_one(&user, json, "has a new password")?;
        }
        UserCommand::Delete { name } => {
            let user = client.delete_user(&name).await?;
            print_one(&user, json, "deleted")?;
        }
        UserCommand::List => {
            let list = client.list_users().await?;
            if json {
                outln!("{}", serde_json::to_string_pretty(&list)?)?;
            } else if list.users.is_empty() {
                outln!("no users (narad user create NAME --password-file FILE adds one)")?;
            } else {
                out!("{}", user_rows(&list.users))?;
            }
        }
    }
    Ok(())
}

fn print_one(user: &UserInfo, json: bool, what: &str) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(user)?)?;
    } else {
        outln!("user {} {what} ({})", user.name, user.mechanisms.join(", "))?;
    }
    Ok(())
}

fn user_rows(users: &[UserInfo]) -> String {
    let rows: Vec<Vec<String>> = users
        .iter()
        .map(|u| {
            vec![
                u.name.clone(),
                u.mechanisms.join(","),
                human::rfc3339_utc(u.created_at_ms),
                human::rfc3339_utc(u.updated_at_ms),
            ]
        })
        .collect();
    table::render(&["NAME", "MECHANISMS", "CREATED", "PASSWORD SET"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_file_loses_one_trailing_newline_and_an_empty_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "s3cret\r\n").unwrap();
        assert_eq!(read_password(&file).unwrap(), "s3cret");
        std::fs::write(&file, "two\n\n").unwrap();
        assert_eq!(read_password(&file).unwrap(), "two\n");
        std::fs::write(&file, "\n").unwrap();
        assert!(
            read_password(&file)
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
        std::fs::write(&file, "x".repeat(MAX_PASSWORD_BYTES + 1)).unwrap();
        assert!(
            read_password(&file)
                .unwrap_err()
                .to_string()
                .contains("longer")
        );
    }
}
