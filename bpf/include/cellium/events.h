/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * cel_events: ring buffer records for drops and, when enabled in
 * cel_config, policy verdicts of new connections and traces of new
 * connections forwarded (with their policy match and the service they
 * were translated through).
 */
#ifndef CELLIUM_EVENTS_H
#define CELLIUM_EVENTS_H

#include <linux/types.h>

#define CEL_EVENT_DROP 1
#define CEL_EVENT_POLICY_VERDICT 2
/* A new connection forwarded, after policy and service translation
 * (CEL_CFG_F_TRACE_EVENTS). */
#define CEL_EVENT_TRACE 3

/* event.verdict for POLICY_VERDICT events. */
#define CEL_VERDICT_ALLOWED 0
#define CEL_VERDICT_DENIED 1
/* A policy drop let through by an audit (always reported, whatever
 * CEL_CFG_F_POLICY_VERDICT_EVENTS says: an audit nobody sees is no audit). */
#define CEL_VERDICT_AUDIT 2

/*
 * Which kind of policy entry let a connection through, with Cilium's
 * numbers (its policy-verdict events' match types). A trace carries the
 * egress decision of the hook in the low four bits of event.match and the
 * destination's ingress decision, when taken in the same hook, in the high
 * four; a policy verdict carries its own in the low four.
 */
#define CEL_MATCH_NONE 0    /* denied, or not decided here */
#define CEL_MATCH_L3_ONLY 1 /* the peer's identity, any protocol and port */
#define CEL_MATCH_L3_L4 2   /* the peer's identity and the port */
#define CEL_MATCH_L4_ONLY 3 /* any identity, the port */
#define CEL_MATCH_ALL 4     /* anything (or the direction is not enforced) */

struct event {
	__u64 ktime;
	__u8 type;      /* CEL_EVENT_* */
	__u8 reason;    /* CEL_REASON_* */
	__u8 direction; /* CEL_DIR_* */
	__u8 protocol;  /* IPv6: the fixed header's next header */
	__u16 endpoint_id; /* the endpoint whose policy or hook decided */
	__u8 family;       /* CEL_FAMILY_IPV4 or CEL_FAMILY_IPV6 */
	__u8 tcp_flags;    /* TCP: the packet's flags byte */
	__u32 src_identity;
	__u32 dst_identity;
	__u8 saddr[16]; /* IPv4 in saddr[0..4], rest zero */
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u32 ifindex; /* the interface the program ran on */
	__u32 len;     /* packet length */
	__u8 verdict;  /* CEL_VERDICT_*, POLICY_VERDICT events */
	__u8 match;    /* CEL_MATCH_* (see above), verdicts and traces */
	__u16 rev_nat_id; /* traces: the frontend the connection was translated
			   * through (its rev-NAT id), 0 when none */
	__u8 icmp_type;   /* ICMP and ICMPv6 (not a later fragment): the type */
	__u8 icmp_code;   /* and the code */
	__u8 pad[6];
};

#endif /* CELLIUM_EVENTS_H */
