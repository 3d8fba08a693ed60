/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * cel_config: ARRAY[1] of datapath-wide settings. layout_version stays the
 * first field in every future layout so that any loader can read it.
 */
#ifndef CELLIUM_CONFIG_H
#define CELLIUM_CONFIG_H

#include <linux/types.h>

/* Emit a POLICY_VERDICT event for every new connection's policy decision. */
#define CEL_CFG_F_POLICY_VERDICT_EVENTS (1 << 0)
/* The node has pods of both families: an address outside the ipcache is
 * world-ipv4 (9) or world-ipv6 (10), as in Cilium's dual-stack mode, instead
 * of world (2). */
#define CEL_CFG_F_WORLD_PER_FAMILY (1 << 1)
/* Emit a TRACE event for every new connection forwarded. Checked once per
 * new connection: established traffic never looks at it. */
#define CEL_CFG_F_TRACE_EVENTS (1 << 2)
/* A new connection to a service without backends is refused with an ICMP
 * (ICMPv6) port unreachable sent back into the client pod (the agent's
 * service-no-backend-response: reject); clear, it is only dropped. */
#define CEL_CFG_F_SERVICE_REJECT (1 << 3)
/* Count every packet and byte of a connection in its conntrack entry (the
 * agent's bpf-conntrack-accounting). Clear, an entry holds its first packet's
 * only and an established connection's packets write nothing to it: the
 * entry is shared by the CPUs of both directions, and two atomic adds per
 * packet keep its cache line moving between them. */
#define CEL_CFG_F_CT_ACCOUNTING (1 << 4)
/* Direct server return (lib/dsr.h) for TCP, and for UDP, of a NodePort
 * balanced to another node's backend in native routing (the agent's
 * bpf-lb-mode: dsr sets both, hybrid TCP's only). */
#define CEL_CFG_F_DSR_TCP (1 << 5)
#define CEL_CFG_F_DSR_UDP (1 << 6)
/* BPF masquerading (lib/masq.h) of pods' IPv4 and IPv6 to the world (the
 * agent's enable-bpf-masquerade with enable-ipv4-masquerade and
 * enable-ipv6-masquerade). */
#define CEL_CFG_F_MASQ4 (1 << 7)
#define CEL_CFG_F_MASQ6 (1 << 8)

/* Timeouts used while a field is still zero (a map nobody configured). */
#define CEL_CT_DEFAULT_TCP_SYN 60
#define CEL_CT_DEFAULT_TCP_ESTABLISHED 21600
#define CEL_CT_DEFAULT_TCP_CLOSING 10
#define CEL_CT_DEFAULT_UDP 60
#define CEL_CT_DEFAULT_ICMP 60
#define CEL_CT_DEFAULT_OTHER 60

struct datapath_config {
	__u32 layout_version; /* CEL_LAYOUT_VERSION of the writer */
	__u32 flags;          /* CEL_CFG_F_* */
	/* Conntrack timeouts in seconds. */
	__u32 ct_tcp_syn;
	__u32 ct_tcp_established;
	__u32 ct_tcp_closing;
	__u32 ct_udp;
	__u32 ct_icmp;
	__u32 ct_other;
	/* Tunnel mode: the ifindex of the node's VXLAN device (collect
	 * metadata), where traffic to other nodes' pods is redirected; 0 when
	 * routing is native. */
	__u32 tunnel_ifindex;
	/* Tunnel mode: the VXLAN device's UDP port (network order), whose
	 * packets cel_from_netdev decapsulates or leaves to the kernel's VXLAN
	 * socket, and the one the programs encapsulate to; 0 when routing is
	 * native. */
	__be16 tunnel_port;
	__u16 pad;
	/* Socket-level load balancing (lib/sock.h): the cookie of the node's
	 * network namespace, whose sockets the cgroup hooks translate; 0 when
	 * bpf-lb-sock is off. */
	__u64 host_netns_cookie;
};

#endif /* CELLIUM_CONFIG_H */
