/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * cel_policy: per-endpoint allow/deny entries. The LPM prefix counts key
 * bits after prefixlen: 64 = any protocol and port (endpoint, direction,
 * identity), 80 = one protocol, any port, 80 + p = a port block of p bits,
 * 96 = one exact port. The datapath looks up (identity) and (identity 0 =
 * any); a deny from either wins, else an allow from either, else the packet
 * is denied if the endpoint enforces that direction.
 */
#ifndef CELLIUM_POLICY_H
#define CELLIUM_POLICY_H

#include <linux/types.h>

#define CEL_POLICY_PREFIX_ANY_PROTO 64
#define CEL_POLICY_PREFIX_ANY_PORT 80
#define CEL_POLICY_PREFIX_FULL 96

struct policy_key {
	__u32 prefixlen;
	__u16 endpoint_id;
	__u8 direction; /* CEL_DIR_INGRESS or CEL_DIR_EGRESS */
	__u8 pad1;
	__u32 identity; /* 0 = any identity */
	__u8 protocol;
	__u8 pad2;
	__be16 dport;
};

/* policy_value.flags: the entry's verdict is only audited (a deny or default deny it
 * decides is let through and reported as an audit verdict). */
#define CEL_POLICY_F_AUDIT 0x01

/* Same size and offsets as before these fields: earlier releases wrote zeros there. */
struct policy_value {
	__u8 deny; /* 1 = deny, 0 = allow */
	__u8 flags; /* CEL_POLICY_F_* */
	__be16 proxy_port; /* reserved for an allow's L7 proxy redirect; zero */
	__u32 cookie; /* reserved for the rule that made the entry; zero (flows name
		       * the deciding policies from the agent's resolved policy) */
};

#endif /* CELLIUM_POLICY_H */
