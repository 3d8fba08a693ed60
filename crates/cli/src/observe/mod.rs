//! `cellium observe`: the flows the datapath saw, with `hubble observe`'s flags.

mod filters;
mod print;

use std::path::Path;
use std::time::{Duration, SystemTime};

use cellium_api::v1::observer_client::ObserverClient;
use cellium_api::v1::{
    GetFlowsRequest, LostEventSource, ServerStatusRequest, Timestamp,
    get_flows_response::ResponseTypes,
};
use clap::Parser;

pub use filters::{FilterArgs, split_not};
use print::Format;

use crate::output;

/// `cellium observe` flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Keep printing new flows as they are seen.
    #[arg(long, short = 'f')]
    follow: bool,
    /// The last N flows kept (default: 20, or none with --follow).
    #[arg(long, value_name = "N")]
    last: Option<u64>,
    /// The first N flows kept.
    #[arg(long, value_name = "N", conflicts_with = "last")]
    first: Option<u64>,
    /// Every flow kept.
    #[arg(long, conflicts_with_all = ["last", "first"])]
    all: bool,
    /// Flows since this time: RFC 3339 (`2026-11-24T05:00:00Z`) or ago (`5m`).
    #[arg(long)]
    since: Option<String>,
    /// Flows until this time: RFC 3339 or ago.
    #[arg(long)]
    until: Option<String>,
    /// Output format.
    #[arg(long, short, value_enum, default_value_t)]
    output: Format,
    /// Print the observer's counters instead of flows (flows kept, seen, lost).
    #[arg(long)]
    status: bool,
    #[command(flatten)]
    filters: FilterArgs,
    /// Negate the next filter flag (`--not --verdict FORWARDED`); may be repeated.
    #[arg(long = "not", hide = true)]
    _not: bool,
    #[arg(skip)]
    negated: Vec<String>,
}

impl Args {
    /// Adds the flags that followed `--not` (see [`split_not`]).
    pub fn with_negated(mut self, negated: Vec<String>) -> Args {
        self.negated = negated;
        self
    }
}

#[derive(Debug, Parser)]
#[command(name = "--not")]
struct Negated {
    #[command(flatten)]
    filters: FilterArgs,
}

fn when(text: &str, flag: &str) -> anyhow::Result<Timestamp> {
    let at = match humantime::parse_rfc3339_weak(text) {
        Ok(t) => t,
        Err(_) => {
            let ago = humantime::parse_duration(text).map_err(|_| {
                anyhow::anyhow!("{flag} {text:?}: an RFC 3339 time or a duration ago (5m)")
            })?;
            SystemTime::now() - ago
        }
    };
    let d = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    Ok(Timestamp {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    })
}

/// Runs `cellium observe`.
pub async fn exec(socket: &Path, args: Args) -> anyhow::Result<()> {
    let mut client = ObserverClient::new(cellium_api::connect(socket).await?);
    if args.status {
        let s = output::answer(
            client.server_status(ServerStatusRequest {}).await,
            "Observer.ServerStatus",
        )?;
        outln!("Current/Max Flows: {}/{}", s.num_flows, s.max_flows);
        outln!("Flows seen: {}", s.seen_flows);
        outln!(
            "Lost events: {} (datapath), {} (followers)",
            s.lost_events,
            s.lost_by_followers
        );
        return Ok(());
    }
    let whitelist = args.filters.filters()?;
    let whitelist = if whitelist == vec![Default::default()] {
        Vec::new()
    } else {
        whitelist
    };
    let blacklist = if args.negated.is_empty() {
        Vec::new()
    } else {
        let mut argv = vec!["--not".to_string()];
        argv.extend(args.negated.iter().cloned());
        Negated::try_parse_from(argv)
            .map_err(|e| anyhow::anyhow!("after --not: {e}"))?
            .filters
            .filters()?
    };
    let (number, first) = match (args.first, args.last, args.all, args.follow) {
        (Some(n), _, _, _) => (n, true),
        (_, Some(n), _, _) => (n, false),
        (_, _, true, _) => (0, false),
        (_, _, false, true) => (0, false),
        (_, _, false, false) => (20, false),
    };
    let req = GetFlowsRequest {
        number,
        first,
        follow: args.follow,
        whitelist,
        blacklist,
        since: args
            .since
            .as_deref()
            .map(|t| when(t, "--since"))
            .transpose()?,
        until: args
            .until
            .as_deref()
            .map(|t| when(t, "--until"))
            .transpose()?,
    };
    let mut stream = output::answer(client.get_flows(req).await, "Observer.GetFlows")?;
    let mut rows = Vec::new();
    loop {
        let r = match stream.message().await {
            Ok(Some(r)) => r,
            Ok(None) => break,
            Err(s) => {
                if args.output == Format::Table {
                    output::print_table(&print::TABLE_HEADER, &rows);
                }
                return Err(anyhow::anyhow!(
                    "Observer.GetFlows: the stream of flows broke off ({}); the agent stopped or restarted, run the command again",
                    output::reason(&s)
                ));
            }
        };
        match r.response_types {
            Some(ResponseTypes::Flow(f)) => match args.output {
                Format::Compact => outln!("{}", print::compact(&f)),
                Format::Json => outln!("{}", print::json(&f)),
                Format::Dict => outln!("{}\n", print::dict(&f)),
                Format::Table => rows.push(print::row(&f)),
            },
            Some(ResponseTypes::LostEvents(l)) => {
                let source = match l.source() {
                    LostEventSource::PerfEventRingBuffer => "in the datapath (ring buffer full)",
                    LostEventSource::ObserverEventsQueue => "by this client (too slow)",
                    LostEventSource::UnknownLostEventSource => "",
                };
                eprintln!("EVENTS LOST: {} {source}", l.num_events_lost);
            }
            None => {}
        }
    }
    if args.output == Format::Table {
        output::print_table(&print::TABLE_HEADER, &rows);
    }
    Ok(())
}
