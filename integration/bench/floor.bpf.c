// SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0)
/*
 * The floor of a datapath on veths, for integration/bench/datapath.sh: the
 * least any program must do to hand a pod's packet to another pod past the
 * node's stack (match the destination, rewrite both MACs,
 * bpf_redirect_peer), with no lookup, conntrack, policy or counter. Built
 * per direction by the benchmark, with the peer's addresses and devices as
 * constants (-D): DST4 (IPv4, host order), DST6_LAST (the IPv6 address's
 * last 32 bits, host order), TARGET (the destination's host-side ifindex),
 * DMAC and SMAC (the destination pod's MAC and its host side's).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

SEC("tc")
int floor_redirect(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	const unsigned char dmac[ETH_ALEN] = { DMAC }, smac[ETH_ALEN] = { SMAC };
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > end)
		return TC_ACT_OK;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > end || ip->daddr != bpf_htonl(DST4))
			return TC_ACT_OK;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > end || ip6->daddr.s6_addr32[3] != bpf_htonl(DST6_LAST))
			return TC_ACT_OK;
	} else {
		return TC_ACT_OK;
	}
	__builtin_memcpy(eth->h_dest, dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, smac, ETH_ALEN);
	return bpf_redirect_peer(TARGET, 0);
}

char LICENSE[] SEC("license") = "Dual BSD/GPL";
