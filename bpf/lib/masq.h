/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * BPF masquerading (Cilium's enable-bpf-masquerade): a pod's connection to
 * the world leaves the node with the node's address, the one of the device
 * the node's FIB routes it out of (BPF_FIB_LOOKUP_SRC), so that the world,
 * which has no route to pod CIDRs, can answer.
 *
 * Where: in cel_from_container, after conntrack and policy (which judge the
 * pod's own address), as the packet is forwarded; it is then routed past the
 * node's stack (lib/fib.h), which would drop a packet carrying one of the
 * node's own addresses as a martian. The reply comes back on the device, to
 * cel_from_netdev, which finds the connection in cel_snat4/6 (nodeport_reply)
 * and hands it to the pod as any packet from outside.
 *
 * What: the connections a pod starts (never its replies: a client that
 * reached the pod keeps talking to the pod's address), over TCP, UDP and
 * ICMP echo, to a destination that is not a cluster peer (another node's
 * pod or another node), not one of this node's own addresses, and outside
 * cel_ipmasq (the native routing CIDRs, other nodes' pod CIDRs and the
 * ip-masq-agent's nonMasqueradeCIDRs). The entries are those of NodePort's
 * SNAT (lib/nodeport.h: cel_snat4/6, forward and reverse per connection,
 * LRU, collected with conntrack by the agent);
 * only connections leaving by a device cel_from_netdev is attached to
 * (cel_netdevs) are masqueraded, where the replies are translated back;
 * the port, or echo identifier, is always drawn from CEL_SNAT_PORT_MIN..MAX,
 * above the kernel's ephemeral range, so no connection of the node's own
 * sockets shares a reply tuple with a masqueraded one.
 */
#ifndef CELLIUM_LIB_MASQ_H
#define CELLIUM_LIB_MASQ_H

#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_helpers.h>

#include "conntrack.h"
#include "fib.h"
#include "lookup.h"
#include "maps.h"
#include "nodeport.h"
#include "packet.h"
#include "scratch.h"

/* Whether the protocol and message can be masqueraded: TCP, UDP, and ICMP
 * echo requests (an echo reply a pod sends answers someone who reached it). */
static __always_inline int masq_proto(__u8 protocol, __u8 icmp_type, __u8 frag, __u8 echo)
{
	if (protocol == CEL_PROTO_TCP || protocol == CEL_PROTO_UDP)
		return 1;
	/* A later fragment's type is unknown: its first fragment's entry
	 * decides (snat4 finds it, or the fragment goes on as it is). */
	return (protocol == CEL_PROTO_ICMP || protocol == CEL_PROTO_ICMPV6) &&
	       (frag == CEL_FRAG_LATER || icmp_type == echo);
}

/* Whether a destination's identity rules masquerading out: this node, or
 * a cluster peer, which knows the pod's address (routed or tunnelled). */
static __always_inline int masq_identity_excluded(__u32 identity)
{
	return identity == CEL_IDENTITY_HOST || is_cluster_peer(identity);
}

static __always_inline int masq4_excluded(const struct datapath_config *cfg, __be32 daddr)
{
	struct ipcache_key key = {};

	key.prefixlen = 32 + 32;
	key.family = CEL_FAMILY_IPV4;
	__builtin_memcpy(key.addr, &daddr, 4);
	if (bpf_map_lookup_elem(&cel_ipmasq, &key))
		return 1;
	return masq_identity_excluded(ipcache_identity4(cfg, daddr));
}

static __always_inline int masq6_excluded(const struct datapath_config *cfg, const __u8 *daddr)
{
	struct ipcache_key key = {};

	key.prefixlen = 32 + 128;
	key.family = CEL_FAMILY_IPV6;
	__builtin_memcpy(key.addr, daddr, 16);
	if (bpf_map_lookup_elem(&cel_ipmasq, &key))
		return 1;
	return masq_identity_excluded(ipcache_identity6(cfg, daddr));
}

/*
 * Whether a pod's packet, not for a local endpoint nor a cluster peer (p4 in
 * s), is masqueraded (see the top); if so, the route out is in s->masq.fib.
 * A connection is masqueraded from its first packet (`new`) or never: one
 * that began unmasqueraded (before cel_from_netdev reached its device) keeps
 * its address. No route, or no address to send from: the node's stack is
 * left to refuse it; a device whose replies would not be translated back:
 * left as it is. The decision, the translation (masq4_send) and the
 * caller each have their own frame: the verifier adds up the frames of a
 * call chain, not those of siblings.
 */
static __noinline int masq4_wanted(struct __sk_buff *skb, const struct datapath_config *cfg,
				   struct scratch6 *s, int new)
{
	struct bpf_fib_lookup *fib = &s->masq.fib;
	struct pkt *p = &s->p4;

	if (!(cfg->flags & CEL_CFG_F_MASQ4) ||
	    !masq_proto(p->protocol, p->icmp_type, p->frag, CEL_ICMP_ECHO_REQUEST))
		return 0;
	if (!new) {
		ct_key_from_pkt(&s->masq.snat4.fk, p, CEL_SNAT_F_FORWARD);
		if (!bpf_map_lookup_elem(&cel_snat4, &s->masq.snat4.fk))
			return 0;
	} else if (masq4_excluded(cfg, p->daddr)) {
		return 0;
	}
	__builtin_memset(fib, 0, sizeof(*fib));
	return fib_lookup4(skb, p, fib, BPF_FIB_LOOKUP_SRC) == 0 && fib->ipv4_src &&
	       bpf_map_lookup_elem(&cel_netdevs, &fib->ifindex);
}

/* Masquerades the packet masq4_wanted chose and sends it the way it found.
 * Returns the verdict, or -CEL_REASON_NAT_FAILED. */
static __noinline int masq4_send(struct __sk_buff *skb, struct scratch6 *s)
{
	if (snat4_in(skb, &s->p4, s->masq.fib.ipv4_src, 0, &s->masq.snat4))
		return -CEL_REASON_NAT_FAILED;
	return fib_forward4(skb, &s->p4, &s->masq.fib);
}

/* masq4_wanted for IPv6 (p in s). */
static __noinline int masq6_wanted(struct __sk_buff *skb, const struct datapath_config *cfg,
				   struct scratch6 *s, int new)
{
	struct bpf_fib_lookup *fib = &s->masq.fib;
	struct pkt6 *p = &s->p;

	if (!(cfg->flags & CEL_CFG_F_MASQ6) ||
	    !masq_proto(p->protocol, p->icmp_type, p->frag, CEL_ICMP6_ECHO_REQUEST))
		return 0;
	if (!new) {
		ct6_key_from_pkt(&s->masq.snat6.fk, p, CEL_SNAT_F_FORWARD);
		if (!bpf_map_lookup_elem(&cel_snat6, &s->masq.snat6.fk))
			return 0;
	} else if (masq6_excluded(cfg, p->daddr)) {
		return 0;
	}
	__builtin_memset(fib, 0, sizeof(*fib));
	return fib_lookup6(skb, p, fib, BPF_FIB_LOOKUP_SRC) == 0 &&
	       !ipv6_unspecified((const __u8 *)fib->ipv6_src) &&
	       bpf_map_lookup_elem(&cel_netdevs, &fib->ifindex);
}

/* masq4_send for IPv6. */
static __noinline int masq6_send(struct __sk_buff *skb, struct scratch6 *s)
{
	if (snat6_in(skb, &s->p, (const __u8 *)s->masq.fib.ipv6_src, 0, &s->masq.snat6))
		return -CEL_REASON_NAT_FAILED;
	return fib_forward6(skb, &s->masq.fib);
}

#endif /* CELLIUM_LIB_MASQ_H */
