/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * A service without backends refuses a new connection at once instead of
 * dropping it, as kube-proxy's REJECT rule and Cilium's tail_no_service_ipv4
 * do: the client's packet becomes an ICMP (ICMPv6) port unreachable from the
 * service address, and goes straight back into the pod. Its TCP connect()
 * then fails with ECONNREFUSED, and a connected UDP socket gets the same
 * error, where a silent drop would leave them waiting for a timeout.
 *
 * The error quotes the packet as the client sent it (before any translation):
 * its IP header and the first 8 bytes of its L4 header, which is what the
 * client's stack matches against its sockets. Packets whose quote would not
 * be that (IPv4 options, IPv6 extension headers, later fragments, GSO
 * packets that cannot be resized) are dropped as before.
 *
 * Both checksums are computed in full. The client's stack does not always
 * check them: a packet its own stack sent with checksum offload keeps that
 * state (CHECKSUM_PARTIAL) through the rewrite, and a receiver takes such a
 * packet as verified. They must be right regardless, for any other reader
 * of the packet (a capture, a stack that does check).
 */
#ifndef CELLIUM_LIB_REJECT_H
#define CELLIUM_LIB_REJECT_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "ipv6.h"
#include "nd.h"
#include "notify.h"
#include "packet.h"

#define CEL_ICMP_DEST_UNREACH 3
#define CEL_ICMP_PORT_UNREACH 3
#define CEL_ICMP6_DEST_UNREACH 1
#define CEL_ICMP6_PORT_UNREACH 4
#define CEL_REJECT_TTL 64

/* The quote: the client's IP header and 8 bytes of what follows it. */
#define CEL_REJECT4_QUOTE (20 + 8)
#define CEL_REJECT6_QUOTE (40 + 8)
/* The error's IP header, ICMP header and quote, after the Ethernet header. */
#define CEL_REJECT4_IP_LEN (20 + 8 + CEL_REJECT4_QUOTE)
#define CEL_REJECT6_PAYLOAD (8 + CEL_REJECT6_QUOTE)
#define CEL_REJECT6_IP_LEN (40 + CEL_REJECT6_PAYLOAD)

static __always_inline int service_reject(const struct datapath_config *cfg)
{
	return cfg && (cfg->flags & CEL_CFG_F_SERVICE_REJECT);
}

/* The Ethernet header of the answer: back to where the packet came from. */
static __always_inline int reject_macs(struct __sk_buff *skb, __be16 proto)
{
	__u8 in[12], out[14];

	if (bpf_skb_load_bytes(skb, 0, in, sizeof(in)) < 0)
		return -1;
	__builtin_memcpy(&out[0], &in[6], 6);
	__builtin_memcpy(&out[6], &in[0], 6);
	__builtin_memcpy(&out[12], &proto, 2);
	return bpf_skb_store_bytes(skb, 0, out, sizeof(out), 0);
}

/* Turns the IPv4 packet into its port unreachable; 0, or -1 if it cannot
 * be (the packet is then only fit to be dropped). */
static __always_inline int reject4_build(struct __sk_buff *skb, const struct pkt *p)
{
	/* IP header (20), ICMP header (8), quote (28): 56 bytes, a multiple
	 * of four as the checksum helper wants. */
	__u8 f[CEL_REJECT4_IP_LEN] = {};
	__s64 sum;
	__u16 csum;

	if (p->l4_off != ETH_HLEN + 20 || p->frag == CEL_FRAG_LATER)
		return -1;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &f[28], CEL_REJECT4_QUOTE) < 0)
		return -1;

	f[0] = 0x45;
	f[3] = CEL_REJECT4_IP_LEN;
	f[8] = CEL_REJECT_TTL;
	f[9] = CEL_PROTO_ICMP;
	__builtin_memcpy(&f[12], &p->daddr, 4);
	__builtin_memcpy(&f[16], &p->saddr, 4);
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&f[0], 20, 0);
	if (sum < 0)
		return -1;
	csum = csum_fold32((__u64)sum);
	__builtin_memcpy(&f[10], &csum, 2);

	f[20] = CEL_ICMP_DEST_UNREACH;
	f[21] = CEL_ICMP_PORT_UNREACH;
	/* ICMP's checksum covers its message only, no pseudo-header. */
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&f[20], 8 + CEL_REJECT4_QUOTE, 0);
	if (sum < 0)
		return -1;
	csum = csum_fold32((__u64)sum);
	__builtin_memcpy(&f[22], &csum, 2);

	if (bpf_skb_change_tail(skb, ETH_HLEN + CEL_REJECT4_IP_LEN, 0) < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, ETH_HLEN, f, sizeof(f), 0) < 0)
		return -1;
	return reject_macs(skb, bpf_htons(ETH_P_IP));
}

/* As reject4_build, for IPv6: ICMPv6's checksum includes the pseudo-header. */
static __always_inline int reject6_build(struct __sk_buff *skb, const struct pkt6 *p)
{
	__u8 f[CEL_REJECT6_IP_LEN] = {};
	__u8 tail[8] = { 0, 0, 0, CEL_REJECT6_PAYLOAD, 0, 0, 0, CEL_PROTO_ICMPV6 };
	__s64 sum;
	__u16 csum;

	if (p->l4_off != ETH_HLEN + 40 || p->ext_hdrs || p->frag == CEL_FRAG_LATER)
		return -1;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &f[48], CEL_REJECT6_QUOTE) < 0)
		return -1;

	f[0] = 0x60;
	f[5] = CEL_REJECT6_PAYLOAD;
	f[6] = CEL_PROTO_ICMPV6;
	f[7] = CEL_REJECT_TTL;
	__builtin_memcpy(&f[8], p->daddr, 16);
	__builtin_memcpy(&f[24], p->saddr, 16);
	f[40] = CEL_ICMP6_DEST_UNREACH;
	f[41] = CEL_ICMP6_PORT_UNREACH;

	sum = bpf_csum_diff(NULL, 0, (__be32 *)&f[8], 32, 0);
	if (sum < 0)
		return -1;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)tail, sizeof(tail), sum);
	if (sum < 0)
		return -1;
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&f[40], CEL_REJECT6_PAYLOAD, sum);
	if (sum < 0)
		return -1;
	csum = csum_fold32((__u64)sum);
	__builtin_memcpy(&f[42], &csum, 2);

	if (bpf_skb_change_tail(skb, ETH_HLEN + CEL_REJECT6_IP_LEN, 0) < 0)
		return -1;
	if (bpf_skb_store_bytes(skb, ETH_HLEN, f, sizeof(f), 0) < 0)
		return -1;
	return reject_macs(skb, bpf_htons(ETH_P_IPV6));
}

/*
 * A new connection to a frontend without backends, on the pod's host veth:
 * reported and counted as the drop it is (NO_SERVICE_BACKEND), then
 * answered into the pod. The answer skips the node's stack, so no firewall
 * or rate limit of the node's applies to it.
 */
static __always_inline int reject4(struct __sk_buff *skb, const struct pkt *p,
				   const struct trace *t)
{
	drop(skb, p, t, CEL_REASON_NO_SERVICE_BACKEND);
	if (reject4_build(skb, p) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect_peer(skb->ifindex, 0);
}

static __always_inline int reject6(struct __sk_buff *skb, const struct pkt6 *p,
				   const struct trace *t)
{
	drop6(skb, p, t, CEL_REASON_NO_SERVICE_BACKEND);
	if (reject6_build(skb, p) < 0)
		return TC_ACT_SHOT;
	return bpf_redirect_peer(skb->ifindex, 0);
}

#endif /* CELLIUM_LIB_REJECT_H */
