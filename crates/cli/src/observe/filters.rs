//! `hubble observe`'s filter flags as `FlowFilter`s.
//!
//! One-sided flags (`--from-pod`, `--to-port`, ...) and flags about the flow (`--verdict`,
//! `--type`, ...) go into every filter; each flag about either side (`--pod`, `--ip`,
//! `--label`, ...) doubles the filters, one with the source side, one with the destination
//! side, so `--pod shop/web --port 80` selects flows where any pod side and any port side
//! match, as Hubble does. `--not` before a flag puts that flag in a blacklist filter of its
//! own.

use cellium_api::v1::{self, EventTypeFilter, FlowFilter};

/// The filter flags.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct FilterArgs {
    /// Flows of this verdict: FORWARDED, DROPPED (repeatable).
    #[arg(long, value_name = "VERDICT")]
    pub verdict: Vec<String>,
    /// Dropped flows of this reason: POLICY_DENIED, POLICY_DENY, SERVICE_BACKEND_NOT_FOUND, ...
    #[arg(long, value_name = "REASON")]
    pub drop_reason_desc: Vec<String>,
    /// Flows of this event type: drop, trace, policy-verdict (repeatable).
    #[arg(long = "type", short = 't', value_name = "TYPE")]
    pub types: Vec<String>,
    /// Flows from or to this pod: `namespace/name-prefix`, or a name prefix.
    #[arg(long)]
    pub pod: Vec<String>,
    /// Flows from this pod.
    #[arg(long)]
    pub from_pod: Vec<String>,
    /// Flows to this pod.
    #[arg(long)]
    pub to_pod: Vec<String>,
    /// Flows from or to pods of this namespace.
    #[arg(long, short = 'n')]
    pub namespace: Vec<String>,
    /// Flows from pods of this namespace.
    #[arg(long)]
    pub from_namespace: Vec<String>,
    /// Flows to pods of this namespace.
    #[arg(long)]
    pub to_namespace: Vec<String>,
    /// Flows from or to a side whose labels match this selector (`app=web,tier!=db`).
    #[arg(long, short = 'l')]
    pub label: Vec<String>,
    /// Flows from a side whose labels match this selector.
    #[arg(long)]
    pub from_label: Vec<String>,
    /// Flows to a side whose labels match this selector.
    #[arg(long)]
    pub to_label: Vec<String>,
    /// Flows from or to this address or CIDR.
    #[arg(long)]
    pub ip: Vec<String>,
    /// Flows from this address or CIDR.
    #[arg(long)]
    pub from_ip: Vec<String>,
    /// Flows to this address or CIDR.
    #[arg(long)]
    pub to_ip: Vec<String>,
    /// Flows from or to this port.
    #[arg(long)]
    pub port: Vec<String>,
    /// Flows from this port.
    #[arg(long)]
    pub from_port: Vec<String>,
    /// Flows to this port.
    #[arg(long)]
    pub to_port: Vec<String>,
    /// Flows of this protocol: tcp, udp, icmp, icmpv6, sctp.
    #[arg(long)]
    pub protocol: Vec<String>,
    /// Flows from or to this security identity.
    #[arg(long)]
    pub identity: Vec<u32>,
    /// Flows from this security identity.
    #[arg(long)]
    pub from_identity: Vec<u32>,
    /// Flows to this security identity.
    #[arg(long)]
    pub to_identity: Vec<u32>,
    /// Flows that went through this service (`namespace/name`).
    #[arg(long, alias = "to-service")]
    pub service: Vec<String>,
    /// Flows in this direction, relative to the endpoint that decided: ingress, egress.
    #[arg(long)]
    pub traffic_direction: Vec<String>,
    /// Flows that are (true) or are not (false) replies.
    #[arg(long)]
    pub is_reply: Option<bool>,
}

/// Which side a flag is about.
#[derive(Clone, Copy)]
enum Side {
    Source,
    Destination,
}

fn pods(pods: &[String], namespaces: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for p in pods {
        if p.contains('/') || namespaces.is_empty() {
            out.push(p.clone());
        } else {
            out.extend(namespaces.iter().map(|ns| format!("{ns}/{p}")));
        }
    }
    if pods.is_empty() {
        out.extend(namespaces.iter().map(|ns| format!("{ns}/")));
    }
    out
}

fn set_side(f: &mut FlowFilter, side: Side, field: &str, values: &[String], ids: &[u32]) {
    let (s, d) = (
        matches!(side, Side::Source),
        matches!(side, Side::Destination),
    );
    let target = match (field, s, d) {
        ("pod", true, _) => &mut f.source_pod,
        ("pod", _, true) => &mut f.destination_pod,
        ("label", true, _) => &mut f.source_label,
        ("label", _, true) => &mut f.destination_label,
        ("ip", true, _) => &mut f.source_ip,
        ("ip", _, true) => &mut f.destination_ip,
        ("port", true, _) => &mut f.source_port,
        ("port", _, true) => &mut f.destination_port,
        ("identity", true, _) => {
            f.source_identity.extend_from_slice(ids);
            return;
        }
        _ => {
            f.destination_identity.extend_from_slice(ids);
            return;
        }
    };
    target.extend_from_slice(values);
}

fn verdict(text: &str) -> anyhow::Result<i32> {
    let upper = text.trim().to_ascii_uppercase();
    v1::Verdict::from_str_name(&format!("VERDICT_{upper}"))
        .map(|v| v as i32)
        .ok_or_else(|| anyhow::anyhow!("--verdict {text:?}: one of FORWARDED, DROPPED"))
}

fn event_type(text: &str) -> anyhow::Result<EventTypeFilter> {
    let (name, sub) = match text.split_once(':') {
        Some((n, s)) => (n, Some(s)),
        None => (text, None),
    };
    let r#type = match name.trim().to_ascii_lowercase().as_str() {
        "drop" => 1,
        "trace" => 4,
        "policy-verdict" => 5,
        other => anyhow::bail!("--type {other:?}: one of drop, trace, policy-verdict"),
    };
    let sub_type = match sub.map(|s| s.trim().to_ascii_lowercase()) {
        None => None,
        Some(s) => Some(match s.as_str() {
            "to-endpoint" => 0,
            "from-endpoint" => 5,
            n => n
                .parse()
                .map_err(|_| anyhow::anyhow!("--type {text:?}: a sub-type is a number"))?,
        }),
    };
    Ok(EventTypeFilter {
        r#type,
        match_sub_type: sub_type.is_some(),
        sub_type: sub_type.unwrap_or(0),
    })
}

fn direction(text: &str) -> anyhow::Result<i32> {
    match text.trim().to_ascii_lowercase().as_str() {
        "ingress" => Ok(v1::TrafficDirection::Ingress as i32),
        "egress" => Ok(v1::TrafficDirection::Egress as i32),
        _ => anyhow::bail!("--traffic-direction {text:?}: ingress or egress"),
    }
}

impl FilterArgs {
    /// The filters the flags make: a flow matches when it matches any of them.
    pub fn filters(&self) -> anyhow::Result<Vec<FlowFilter>> {
        let mut base = FlowFilter {
            verdict: self
                .verdict
                .iter()
                .map(|v| verdict(v))
                .collect::<Result<_, _>>()?,
            drop_reason_desc: self.drop_reason_desc.clone(),
            event_type: self
                .types
                .iter()
                .map(|t| event_type(t))
                .collect::<Result<_, _>>()?,
            protocol: self.protocol.clone(),
            traffic_direction: self
                .traffic_direction
                .iter()
                .map(|d| direction(d))
                .collect::<Result<_, _>>()?,
            reply: self.is_reply.into_iter().collect(),
            destination_service: self.service.clone(),
            ..FlowFilter::default()
        };
        base.source_pod = pods(&self.from_pod, &self.from_namespace);
        base.destination_pod = pods(&self.to_pod, &self.to_namespace);
        set_side(&mut base, Side::Source, "label", &self.from_label, &[]);
        set_side(&mut base, Side::Destination, "label", &self.to_label, &[]);
        set_side(&mut base, Side::Source, "ip", &self.from_ip, &[]);
        set_side(&mut base, Side::Destination, "ip", &self.to_ip, &[]);
        set_side(&mut base, Side::Source, "port", &self.from_port, &[]);
        set_side(&mut base, Side::Destination, "port", &self.to_port, &[]);
        set_side(
            &mut base,
            Side::Source,
            "identity",
            &[],
            &self.from_identity,
        );
        set_side(
            &mut base,
            Side::Destination,
            "identity",
            &[],
            &self.to_identity,
        );

        let either_pods = pods(&self.pod, &self.namespace);
        let mut filters = vec![base];
        for (field, values, ids) in [
            ("pod", either_pods, Vec::new()),
            ("label", self.label.clone(), Vec::new()),
            ("ip", self.ip.clone(), Vec::new()),
            ("port", self.port.clone(), Vec::new()),
            ("identity", Vec::new(), self.identity.clone()),
        ] {
            if values.is_empty() && ids.is_empty() {
                continue;
            }
            filters = filters
                .into_iter()
                .flat_map(|f| {
                    [Side::Source, Side::Destination].map(|side| {
                        let mut f = f.clone();
                        set_side(&mut f, side, field, &values, &ids);
                        f
                    })
                })
                .collect();
        }
        Ok(filters)
    }
}

/// Splits `observe`'s arguments at each `--not`: the flag after it (with its value) goes to
/// the negated list, everything else stays. `--not --pod a` and `--not --pod=a` both work.
pub fn split_not(args: Vec<String>) -> (Vec<String>, Vec<String>) {
    let Some(at) = args.iter().position(|a| a == "observe") else {
        return (args, Vec::new());
    };
    let mut kept: Vec<String> = args[..=at].to_vec();
    let mut negated = Vec::new();
    let mut rest = args[at + 1..].iter().peekable();
    while let Some(a) = rest.next() {
        if a != "--not" {
            kept.push(a.clone());
            continue;
        }
        let Some(flag) = rest.next() else {
            kept.push(a.clone());
            break;
        };
        negated.push(flag.clone());
        let takes_value = flag.starts_with('-') && !flag.contains('=');
        if takes_value && let Some(v) = rest.next() {
            negated.push(v.clone());
        }
    }
    (kept, negated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct T {
        #[command(flatten)]
        f: FilterArgs,
    }

    fn filters(args: &[&str]) -> Vec<FlowFilter> {
        let mut all = vec!["t"];
        all.extend_from_slice(args);
        T::parse_from(all).f.filters().unwrap()
    }

    #[test]
    fn either_side_flags_double_the_filters_and_one_sided_ones_join_each() {
        let f = filters(&[
            "--pod",
            "shop/web",
            "--to-port",
            "80",
            "--verdict",
            "dropped",
        ]);
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].source_pod, ["shop/web"]);
        assert_eq!(f[1].destination_pod, ["shop/web"]);
        for x in &f {
            assert_eq!(x.destination_port, ["80"]);
            assert_eq!(x.verdict, [v1::Verdict::Dropped as i32]);
        }
        let f = filters(&[
            "--from-namespace",
            "shop",
            "--from-pod",
            "web",
            "--to-namespace",
            "db",
        ]);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].source_pod, ["shop/web"]);
        assert_eq!(f[0].destination_pod, ["db/"]);
        assert_eq!(filters(&["--ip", "10.0.0.1", "--port", "53"]).len(), 4);
        let t = filters(&["--type", "policy-verdict", "--type", "trace:to-endpoint"]);
        assert_eq!(t[0].event_type[0].r#type, 5);
        assert!(t[0].event_type[1].match_sub_type);
    }

    #[test]
    fn not_takes_the_next_flag_and_its_value() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (kept, neg) = split_not(args(&[
            "cellium",
            "observe",
            "--follow",
            "--not",
            "--verdict",
            "DROPPED",
            "--pod",
            "a",
            "--not",
            "--to-port=53",
        ]));
        assert_eq!(
            kept,
            args(&["cellium", "observe", "--follow", "--pod", "a"])
        );
        assert_eq!(neg, args(&["--verdict", "DROPPED", "--to-port=53"]));
        let (kept, neg) = split_not(args(&["cellium", "status", "--not"]));
        assert_eq!((kept.len(), neg.len()), (3, 0));
    }

    #[test]
    fn bad_values_are_refused_naming_the_flag() {
        let e = T::parse_from(["t", "--verdict", "maybe"])
            .f
            .filters()
            .unwrap_err();
        assert!(e.to_string().contains("--verdict"), "{e}");
        let e = T::parse_from(["t", "--type", "l7"])
            .f
            .filters()
            .unwrap_err();
        assert!(e.to_string().contains("--type"), "{e}");
    }
}
