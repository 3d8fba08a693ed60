/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * cel_frag4: the datagrams being fragmented, as Cilium's fragment map. Only
 * the first fragment of a datagram carries its L4 header; it records its
 * ports here under (addresses, IP ID, protocol), and every later fragment
 * takes them from here, so that it meets the same conntrack entry, policy
 * and translation as its first. A later fragment without an entry is
 * dropped: on its own nothing says what it belongs to.
 */
#ifndef CELLIUM_FRAG_H
#define CELLIUM_FRAG_H

#include <linux/types.h>

struct frag4_key {
	__be32 saddr;
	__be32 daddr;
	__be16 id; /* the IPv4 identification */
	__u8 protocol;
	__u8 pad;
};

/* The first fragment's L4 ports (ICMP echo: the identifier as conntrack
 * uses it). */
struct frag_ports {
	__be16 sport;
	__be16 dport;
};

#endif /* CELLIUM_FRAG_H */
