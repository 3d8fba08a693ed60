/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * cel_frag4 and cel_frag6: the datagrams being fragmented, as Cilium's
 * fragment maps. Only the first fragment of a datagram carries its L4
 * header; it records its protocol and ports here under (addresses,
 * identification, the protocol its IP or fragment header names), and every
 * later fragment takes them from here, so that it meets the same conntrack
 * entry, policy and translation as its first. A later fragment without an
 * entry is dropped: on its own nothing says what it belongs to.
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

struct frag6_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__be32 id; /* the fragment header's identification */
	__u8 protocol; /* the fragment header's next header */
	__u8 pad[3];
};

/* The first fragment's upper-layer protocol (IPv6: past the extension
 * headers that follow the fragment header) and L4 ports (ICMP echo: the
 * identifier as conntrack uses it). */
struct frag_ports {
	__be16 sport;
	__be16 dport;
	__u8 protocol;
	__u8 pad[3];
};

#endif /* CELLIUM_FRAG_H */
