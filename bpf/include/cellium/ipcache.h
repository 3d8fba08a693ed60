/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * cel_ipcache: IP prefix -> security identity. A miss means world (2).
 * In tunnel mode a prefix of another node's pods also names that node: the
 * datapath encapsulates traffic to it towards tunnel_endpoint.
 */
#ifndef CELLIUM_IPCACHE_H
#define CELLIUM_IPCACHE_H

#include <linux/types.h>

struct ipcache_key {
	/* LPM prefix over the bytes after this field: 32 (family + pad) plus
	 * the IP prefix length, so IPv4 and IPv6 never match each other. */
	__u32 prefixlen;
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};

struct ipcache_value {
	__u32 identity;
	/* IPv4 address of the node hosting the prefix, network order; 0 when
	 * traffic to it is not tunnelled (was a reserved zero field: entries
	 * written before tunnel mode read as not tunnelled). */
	__be32 tunnel_endpoint;
};

/* cel_ipmasq values: why a destination prefix is not masqueraded, one bit
 * per owner (the datapath only asks whether the prefix is there). */
#define CEL_IPMASQ_NATIVE_ROUTING 1 /* ipv4/ipv6-native-routing-cidr */
#define CEL_IPMASQ_AGENT 2          /* the ip-masq-agent's configuration */
#define CEL_IPMASQ_POD_CIDR 4       /* another node's pod CIDR */

#endif /* CELLIUM_IPCACHE_H */
