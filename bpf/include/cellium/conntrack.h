/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * cel_ct4 and cel_ct6: the node's connection tables, one per family, with
 * the same entries. Keys are the tuple of the connection's first packet (the
 * "forward" direction); replies are found by looking up the reversed tuple.
 * Service entries (CEL_CT_F_SERVICE) are keyed on client -> VIP and remember
 * the chosen backend.
 */
#ifndef CELLIUM_CONNTRACK_H
#define CELLIUM_CONNTRACK_H

#include <linux/types.h>

/* The key is a client -> frontend tuple that remembers a backend choice. */
#define CEL_CT_F_SERVICE (1 << 0)

/* Index of ct_entry's per-direction arrays. */
#define CEL_CT_FORWARD 0
#define CEL_CT_REPLY 1

/* Connection state (TCP; other protocols stay ESTABLISHED). */
#define CEL_CT_STATE_SYN 0
#define CEL_CT_STATE_ESTABLISHED 1
#define CEL_CT_STATE_CLOSING 2

struct ct_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport; /* ICMP echo: the identifier on the request side */
	__be16 dport;
	__u8 protocol;
	__u8 flags; /* CEL_CT_F_* */
	__u16 pad;
};

struct ct6_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport; /* ICMPv6 echo: the identifier on the request side */
	__be16 dport;
	__u8 protocol; /* the upper-layer protocol, past extension headers */
	__u8 flags;    /* CEL_CT_F_* */
	__u16 pad;
};

/* ct_entry.flags: which end of the connection is a local endpoint whose
 * ingress policy admitted it (the sender of the first packet is, when a pod
 * sent it). A packet of the connection delivered to a local endpoint at an
 * end without its flag is checked against that endpoint's ingress policy:
 * the entry was recorded while the address was not that endpoint's. Zero in
 * entries of older builds, which are thus checked once more, never trusted. */
#define CEL_CT_F_SRC_LOCAL 0x01
#define CEL_CT_F_DST_LOCAL 0x02

struct ct_entry {
	__u64 expires_ns; /* bpf_ktime_get_ns() deadline */
	__u64 created_ns;
	__u64 packets[2]; /* [CEL_CT_FORWARD], [CEL_CT_REPLY] */
	__u64 bytes[2];
	__u32 backend_id; /* service entries: the chosen backend */
	__u16 rev_nat_id; /* non-zero: replies get their source rewritten */
	__u8 tcp_flags[2]; /* TCP flags seen, per direction */
	__u8 state;        /* CEL_CT_STATE_* */
	__u8 flags;        /* CEL_CT_F_* */
	/* A tuple clash's source port translation (network order, 0 = none): on
	 * a service entry the port its client's packets get, on the translated
	 * connection's entry the client's own port its replies get back. */
	__be16 nat_port;
	__u32 pad2;
};

#endif /* CELLIUM_CONNTRACK_H */
