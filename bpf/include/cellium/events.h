/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * cel_events: ring buffer records for drops and, when enabled in
 * cel_config, policy verdicts of new connections.
 */
#ifndef CELLIUM_EVENTS_H
#define CELLIUM_EVENTS_H

#include <linux/types.h>

#define CEL_EVENT_DROP 1
#define CEL_EVENT_POLICY_VERDICT 2

/* event.verdict for POLICY_VERDICT events. */
#define CEL_VERDICT_ALLOWED 0
#define CEL_VERDICT_DENIED 1

struct event {
	__u64 ktime;
	__u8 type;      /* CEL_EVENT_* */
	__u8 reason;    /* CEL_REASON_* */
	__u8 direction; /* CEL_DIR_* */
	__u8 protocol;  /* IPv6: the fixed header's next header */
	__u16 endpoint_id; /* the endpoint whose policy or hook decided */
	__u8 family;       /* CEL_FAMILY_IPV4 or CEL_FAMILY_IPV6 */
	__u8 pad;
	__u32 src_identity;
	__u32 dst_identity;
	__u8 saddr[16]; /* IPv4 in saddr[0..4], rest zero */
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u32 ifindex; /* the interface the program ran on */
	__u32 len;     /* packet length */
	__u8 verdict;  /* CEL_VERDICT_*, POLICY_VERDICT events */
	__u8 pad2[3];
};

#endif /* CELLIUM_EVENTS_H */
