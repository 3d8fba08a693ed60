//! `cellium-cni`: the CNI plugin binary. Reads the `CNI_*` environment and stdin, runs the verb,
//! prints the result (or the spec's error object) on stdout and exits non-zero on error.

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;
use std::time::{Instant, SystemTime};

use cellium_cni::calllog::Record;
use cellium_cni::commands::{self, Reply};
use cellium_cni::{Env, Error, Verb, config, version};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let started = Instant::now();
    let env = Env::from_process();
    let (stdin, read_error) = match read_stdin() {
        Ok(bytes) => (bytes, None),
        Err(e) => (Vec::new(), Some(e)),
    };
    let outcome = match (env.verb(), read_error) {
        (Err(e), _) | (Ok(_), Some(e)) => Err(e),
        (Ok(verb), None) => dispatch(verb, &env, &stdin).await,
    };
    if let Err(Error::MissingCommand) = outcome {
        // Someone ran the binary by hand: say what it is, as the reference plugins do.
        eprintln!(
            "CNI plugin cellium-cni v{}; CNI protocol versions supported: {}",
            env!("CARGO_PKG_VERSION"),
            version::supported_list()
        );
    }
    if let Some(path) = config::log_file(&stdin) {
        let record = Record {
            verb: env.command.as_deref().unwrap_or("-"),
            container_id: env.container_id.as_deref(),
            ifname: env.ifname.as_deref(),
            outcome: match &outcome {
                Ok(reply) => Ok(reply.summary.as_str()),
                Err(e) => Err((e.code(), e.to_string())),
            },
            elapsed: started.elapsed(),
            at: SystemTime::now(),
        };
        if let Err(e) = record.append_to(&path) {
            // The log is an aid: failing to write it must not fail the runtime's call.
            eprintln!(
                "cellium-cni: cannot append to log-file {}: {e}",
                path.display()
            );
        }
    }
    match outcome {
        Ok(Reply { stdout, .. }) => {
            if let Some(value) = stdout {
                print_json(&value);
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            print_json(&e.to_object(version::of_input(&stdin)));
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(verb: Verb, env: &Env, stdin: &[u8]) -> Result<Reply, Error> {
    match verb {
        Verb::Add => commands::add::exec(env, stdin).await,
        Verb::Del => commands::del::exec(env, stdin).await,
        Verb::Check => commands::check::exec(env, stdin).await,
        Verb::Status => commands::status::exec(stdin).await,
        Verb::Gc => commands::gc::exec(stdin).await,
        Verb::Version => commands::version::exec(stdin),
    }
}

/// Reads all of stdin; a terminal is not read, so running the binary by hand does not hang.
fn read_stdin() -> Result<Vec<u8>, Error> {
    let mut stdin = std::io::stdin();
    let mut bytes = Vec::new();
    if !stdin.is_terminal() {
        stdin
            .read_to_end(&mut bytes)
            .map_err(|source| Error::ReadStdin { source })?;
    }
    Ok(bytes)
}

fn print_json(value: &impl serde::Serialize) {
    let mut out = std::io::stdout().lock();
    // Serializing plain data cannot fail; a closed stdout leaves nobody to tell.
    if let Ok(text) = serde_json::to_string_pretty(value) {
        let _ = writeln!(out, "{text}");
    }
}
