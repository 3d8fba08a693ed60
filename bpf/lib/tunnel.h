/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Tunnel mode (routing-mode: tunnel): traffic from a pod to a pod of another
 * node is encapsulated in VXLAN towards that node (from the ipcache) with
 * the source's security identity as the VNI, as Cilium does; the receiving
 * node reads the identity back and enforces ingress policy with it.
 *
 * The programs encapsulate and decapsulate themselves where they can
 * (tunnel_send, tunnel_decap): the outer headers are written with
 * bpf_skb_adjust_room and the packet goes straight to the underlay device
 * (bpf_redirect_neigh); on the other node cel_from_netdev takes them off and
 * hands the inner packet to the pod. Neither node's VXLAN device is crossed,
 * which saves its transmit (a route lookup per packet: a BPF tunnel key has
 * no route cache) and its receive (a UDP socket, a GRO cell, a second pass
 * through the receive path). The wire format is the device's (RFC 7348: UDP
 * to its port, a zero UDP checksum, the inner Ethernet frame), so either end
 * may take either path. Whatever the programs do not take goes through the
 * node's VXLAN device (collect metadata) as before, with a tunnel key:
 *  - sending: a kernel without BPF_FIB_LOOKUP_SRC (6.7) or no route to the
 *    node, a packet larger than the route's MTU once encapsulated (the
 *    device fragments the outer packet), one encapsulated already, and IPv6
 *    pods' packets (not yet measured in a dual-stack cluster);
 *  - receiving: GSO packets (aggregated by GRO, or a veth's), since the
 *    device resets their encapsulation state and a program cannot until
 *    BPF_F_ADJ_ROOM_DECAP_L4_UDP (left stale it would break their
 *    segmentation if the pod forwarded them, and their checksums are only
 *    valid per segment); IP options or fragments; a UDP checksum to verify;
 *    a CE mark on the outer header (the device merges it into the inner
 *    one, RFC 6040); unknown VXLAN flags; an inner packet that is not IPv4
 *    or not for a local pod; outer packets not addressed to this node.
 * On either receive path the VNI is believed only from another node the
 * agent knows, and only for an identity a node sends (tunnel_identity).
 *
 * State lives in a per-CPU scratch map, not on the stack: the calling
 * programs already use most of the 512 bytes BPF allows.
 */
#ifndef CELLIUM_LIB_TUNNEL_H
#define CELLIUM_LIB_TUNNEL_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "fib.h"
#include "lookup.h"
#include "maps.h"
#include "packet.h"

/* RFC 7348's header: the I flag says the VNI is valid; the VNI is its
 * upper 24 bits, the low byte reserved. */
struct vxlan_hdr {
	__be32 flags;
	__be32 vni;
};

#define CEL_VXLAN_FLAG_VNI 0x08000000

/* Everything one encapsulation puts in front of the inner IP header. */
struct vxlan_encap {
	struct iphdr ip;
	struct udphdr udp;
	struct vxlan_hdr vxlan;
	struct ethhdr inner;
} __attribute__((packed));

/* The ECN field of the outer header: a congestion mark (CE) set on the way
 * is the device's to merge into the inner header (RFC 6040). */
#define CEL_ECN_MASK 0x03
#define CEL_ECN_CE 0x03

#define CEL_VXLAN_ENCAP_LEN ((__s32)sizeof(struct vxlan_encap))

/* The kernel's own choice of VXLAN source ports (the ephemeral range),
 * spread by the inner flow's hash so that the underlay can balance flows. */
#define CEL_VXLAN_SPORT_MIN 32768
#define CEL_VXLAN_SPORT_RANGE (61000 - CEL_VXLAN_SPORT_MIN)

struct tunnel_scratch {
	struct vxlan_encap hdr;
	struct ipcache_key lookup;
	struct bpf_tunnel_key key;
	struct bpf_fib_lookup fib;
	struct bpf_redir_neigh nh;
	/* What tunnel_lookup found, for tunnel_send. */
	__be32 remote;
	__u32 vni;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct tunnel_scratch);
	__uint(max_entries, 1);
} cel_tunnel_scratch SEC(".maps");

/* The VNI is 24 bits wide: identities beyond it cannot be carried. */
#define CEL_TUNNEL_VNI_MAX 0xffffff

/* Not tunnelled: the packet goes on as in native routing. (Never a drop:
 * the reasons tunnel functions return negated are other than 1.) */
#define TUNNEL_PASS -1

static __always_inline struct tunnel_scratch *tunnel_scratch(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&cel_tunnel_scratch, &zero);
}

/* Finds the node hosting addr (4 or 16 address bytes by family) when tunnel
 * mode is on, for tunnel_send or tunnel_set_key, with src_identity (the
 * source's cluster identity, never a node-local one) as the VNI. Returns 0 when the packet
 * is to be tunnelled, TUNNEL_PASS when it is not, or a CEL_REASON_* (> 0)
 * to drop it with. */
static __always_inline int tunnel_lookup(const struct datapath_config *cfg, __u8 family,
					 const void *addr, __u32 src_identity)
{
	struct tunnel_scratch *s;
	struct ipcache_value *v;

	if (!cfg || !cfg->tunnel_ifindex)
		return TUNNEL_PASS;
	s = tunnel_scratch();
	if (!s)
		return TUNNEL_PASS;
	__builtin_memset(&s->lookup, 0, sizeof(s->lookup));
	s->lookup.family = family;
	if (family == CEL_FAMILY_IPV4) {
		s->lookup.prefixlen = 32 + 32;
		__builtin_memcpy(s->lookup.addr, addr, 4);
	} else {
		s->lookup.prefixlen = 32 + 128;
		__builtin_memcpy(s->lookup.addr, addr, 16);
	}
	v = bpf_map_lookup_elem(&cel_ipcache, &s->lookup);
	if (!v || !v->tunnel_endpoint)
		return TUNNEL_PASS;
	if (src_identity > CEL_TUNNEL_VNI_MAX)
		return CEL_REASON_ENCAP_FAILED;
	s->remote = v->tunnel_endpoint;
	s->vni = src_identity;
	return 0;
}

/* Sets the tunnel key of what tunnel_lookup found, for the VXLAN device.
 * Returns 0, or CEL_REASON_ENCAP_FAILED. */
static __always_inline int tunnel_set_key(struct __sk_buff *skb)
{
	struct tunnel_scratch *s = tunnel_scratch();

	if (!s)
		return CEL_REASON_ENCAP_FAILED;
	__builtin_memset(&s->key, 0, sizeof(s->key));
	/* The helper takes the remote IPv4 address in host order. */
	s->key.remote_ipv4 = bpf_ntohl(s->remote);
	s->key.tunnel_id = s->vni;
	s->key.tunnel_ttl = 64;
	if (bpf_skb_set_tunnel_key(skb, &s->key, sizeof(s->key), BPF_F_ZERO_CSUM_TX) < 0)
		return CEL_REASON_ENCAP_FAILED;
	return 0;
}

/* Whether the packet already has a tunnel key: a pod's, set by
 * cel_from_container before the redirect to the device. */
static __always_inline int tunnel_has_key(struct __sk_buff *skb)
{
	struct tunnel_scratch *s = tunnel_scratch();

	return s && bpf_skb_get_tunnel_key(skb, &s->key, sizeof(s->key), 0) == 0;
}

/*
 * The source identity a VXLAN packet from sender (its outer source) carries
 * in its VNI, or -CEL_REASON_* to drop it with. Anyone on the underlay can
 * send VXLAN to a node, so the VNI is believed only from a node the agent
 * knows (an address the ipcache gives remote-node: node discovery writes
 * every other node's addresses so), and only for an identity a node sends:
 * its pods' (cluster identities, or init while their labels are not
 * resolved), its health endpoint's, or its own (host, which is, seen from
 * here, remote-node, as in Cilium), or, in DSR (lib/dsr.h), the world for
 * a client from outside. Any other reserved identity (kube-apiserver, ...)
 * is a claim no node makes.
 */
static __always_inline int tunnel_identity(const struct datapath_config *cfg, __be32 sender,
					   __u32 vni)
{
	if (ipcache_identity4(cfg, sender) != CEL_IDENTITY_REMOTE_NODE)
		return -CEL_REASON_UNKNOWN_SENDER;
	if (vni == CEL_IDENTITY_HOST)
		return CEL_IDENTITY_REMOTE_NODE;
	if ((vni >= CEL_IDENTITY_CLUSTER_MIN && vni <= CEL_TUNNEL_VNI_MAX) ||
	    vni == CEL_IDENTITY_HEALTH || vni == CEL_IDENTITY_INIT ||
	    vni == CEL_IDENTITY_REMOTE_NODE)
		return (int)vni;
	if (vni == CEL_IDENTITY_WORLD && cfg &&
	    (cfg->flags & (CEL_CFG_F_DSR_TCP | CEL_CFG_F_DSR_UDP)))
		return (int)vni;
	return -CEL_REASON_INVALID_IDENTITY;
}

/*
 * The source identity of a pod of node sender at saddr (4 or 16 address
 * bytes by family) that arrived with VNI identity id (tunnel_identity):
 * when a policy of this node covers saddr with an ipBlock, the node-local
 * identity the agent derived from the pod's labels and those cidr: labels,
 * as its ipcache entry gives it, provided that entry names sender as the
 * pod's node; id otherwise. The VNI cannot carry such an identity: local
 * numbers are each node's own, and beyond its 24 bits.
 */
static __always_inline int tunnel_covered_identity(__be32 sender, int id, __u8 family,
						   const void *saddr)
{
	struct tunnel_scratch *s = tunnel_scratch();
	struct ipcache_value *v;

	if (!s || id < CEL_IDENTITY_CLUSTER_MIN)
		return id;
	__builtin_memset(&s->lookup, 0, sizeof(s->lookup));
	s->lookup.family = family;
	if (family == CEL_FAMILY_IPV4) {
		s->lookup.prefixlen = 32 + 32;
		__builtin_memcpy(s->lookup.addr, saddr, 4);
	} else {
		s->lookup.prefixlen = 32 + 128;
		__builtin_memcpy(s->lookup.addr, saddr, 16);
	}
	v = bpf_map_lookup_elem(&cel_ipcache, &s->lookup);
	if (v && v->identity >= CEL_IDENTITY_LOCAL_MIN && v->tunnel_endpoint == sender)
		return (int)v->identity;
	return id;
}

/* tunnel_covered_identity for the inner packet of skb, whose IP header
 * (of skb->protocol's family) is at offset inner, from sender. */
static __always_inline int tunnel_inner_identity(struct __sk_buff *skb, __u32 inner,
						 __be32 sender, int id)
{
	__u8 saddr[16];

	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		if (bpf_skb_load_bytes(skb, inner + __builtin_offsetof(struct iphdr, saddr), saddr,
				       4) < 0)
			return id;
		return tunnel_covered_identity(sender, id, CEL_FAMILY_IPV4, saddr);
	}
	if (bpf_skb_load_bytes(skb, inner + __builtin_offsetof(struct ipv6hdr, saddr), saddr,
			       16) < 0)
		return id;
	return tunnel_covered_identity(sender, id, CEL_FAMILY_IPV6, saddr);
}

/* The source identity of a packet the VXLAN device decapsulated, from its
 * tunnel key (tunnel_identity, tunnel_inner_identity); 0 when it has no
 * key. */
static __always_inline int tunnel_source_identity(struct __sk_buff *skb,
						  const struct datapath_config *cfg)
{
	struct tunnel_scratch *s = tunnel_scratch();
	__be32 sender;
	int id;

	if (!s)
		return 0;
	__builtin_memset(&s->key, 0, sizeof(s->key));
	if (bpf_skb_get_tunnel_key(skb, &s->key, sizeof(s->key), 0) < 0)
		return 0;
	/* The helper gives the remote IPv4 address in host order. */
	sender = bpf_htonl(s->key.remote_ipv4);
	id = tunnel_identity(cfg, sender, s->key.tunnel_id);
	return id < 0 ? id : tunnel_inner_identity(skb, ETH_HLEN, sender, id);
}

/* Whether an IPv4 packet off one of the node's devices is the tunnel's own:
 * UDP to the VXLAN device's port (no later fragment, which has no port).
 * tunnel_decap takes those it can, the kernel's VXLAN socket the rest (and
 * hands the inner packet to cel_from_overlay); nothing else cel_from_netdev
 * does (node ports, the fast path to local pods) applies to the outer
 * packet. A node port on the tunnel's port could not be served anyway: the
 * VXLAN socket holds it. */
static __always_inline int tunnel_own_packet4(struct __sk_buff *skb,
					      const struct datapath_config *cfg)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + ETH_HLEN;
	__be16 *ports;

	if (!cfg || !cfg->tunnel_port)
		return 0;
	if ((void *)(ip + 1) > data_end || ip->protocol != IPPROTO_UDP ||
	    ip->frag_off & bpf_htons(CEL_IP_OFFSET))
		return 0;
	ports = (void *)ip + ip->ihl * 4;
	if ((void *)(ports + 2) > data_end)
		return 0;
	return ports[1] == cfg->tunnel_port;
}

/* The folded one's complement checksum of the IPv4 header (no options)
 * at ip. */
static __always_inline __u16 ipv4_header_csum(const void *ip)
{
	const __u16 *w = ip;
	__u32 sum = 0;
	int i;

#pragma unroll
	for (i = 0; i < (int)(sizeof(struct iphdr) / 2); i++)
		sum += w[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* Writes the outer headers of an IPv4 packet of len bytes from saddr to
 * what tunnel_lookup found, the inner Ethernet header already in place. */
static __always_inline void vxlan_fill(struct tunnel_scratch *s, __u32 len, __be32 saddr,
				       __u32 hash, __be16 port, __u8 ecn)
{
	struct vxlan_encap *h = &s->hdr;

	__builtin_memset(&h->ip, 0, sizeof(h->ip));
	h->ip.version = 4;
	h->ip.ihl = 5;
	/* The inner packet's ECN field, as the device copies it (RFC 6040),
	 * so that the underlay may mark rather than drop. */
	h->ip.tos = ecn & CEL_ECN_MASK;
	h->ip.tot_len = bpf_htons(len);
	/* DF clear, as the device sends them: the outer packet may be
	 * fragmented on a narrower path, so it needs an ID. */
	h->ip.id = (__u16)bpf_get_prandom_u32();
	h->ip.ttl = 64;
	h->ip.protocol = IPPROTO_UDP;
	h->ip.saddr = saddr;
	h->ip.daddr = s->remote;
	/* The IPv4 header opens the encapsulation. */
	h->ip.check = ipv4_header_csum(h);
	h->udp.source =
		bpf_htons(CEL_VXLAN_SPORT_MIN + (__u16)(((__u64)hash * CEL_VXLAN_SPORT_RANGE) >> 32));
	h->udp.dest = port;
	h->udp.len = bpf_htons(len - sizeof(struct iphdr));
	h->udp.check = 0;
	h->vxlan.flags = bpf_htonl(CEL_VXLAN_FLAG_VNI);
	h->vxlan.vni = bpf_htonl(s->vni << 8);
}

/* Encapsulates the packet towards what tunnel_lookup found and sends it to
 * the underlay device the node's FIB names for that node. Returns the
 * redirect, TUNNEL_PASS to leave the packet (untouched) to the VXLAN
 * device, or -CEL_REASON_ENCAP_FAILED for a packet changed half-way. Not
 * inlined: its frame is its own, off the sending program's. */
static __noinline int tunnel_encap(struct __sk_buff *skb, __be16 port)
{
	const __u64 flags = BPF_F_ADJ_ROOM_FIXED_GSO | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 |
			    BPF_F_ADJ_ROOM_ENCAP_L4_UDP | BPF_F_ADJ_ROOM_ENCAP_L2_ETH |
			    BPF_F_ADJ_ROOM_ENCAP_L2(ETH_HLEN);
	struct tunnel_scratch *s = tunnel_scratch();
	__be16 outer_proto = bpf_htons(ETH_P_IP);
	__u32 len, hash;
	__u8 tos;
	int ret;

	if (!s || skb->len <= ETH_HLEN)
		return TUNNEL_PASS;
	/* The outer IPv4 packet's length. */
	len = skb->len - ETH_HLEN + CEL_VXLAN_ENCAP_LEN;
	if (len > 0xffff)
		return TUNNEL_PASS;
	__builtin_memset(&s->fib, 0, sizeof(s->fib));
	s->fib.family = CEL_AF_INET;
	s->fib.l4_protocol = IPPROTO_UDP;
	s->fib.ipv4_dst = s->remote;
	/* The route's MTU bounds a single packet; a GSO packet's segments are
	 * cut to the pod's MTU, which leaves room for the outer headers. */
	s->fib.tot_len = skb->gso_size ? 0 : len;
	s->fib.ifindex = skb->ifindex;
	ret = bpf_fib_lookup(skb, &s->fib, sizeof(s->fib), BPF_FIB_LOOKUP_SRC);
	if ((ret != BPF_FIB_LKUP_RET_SUCCESS && ret != BPF_FIB_LKUP_RET_NO_NEIGH) ||
	    !s->fib.ipv4_src)
		return TUNNEL_PASS;
	/* The inner flow's hash, before the outer headers hide it. */
	hash = bpf_get_hash_recalc(skb);
	if (bpf_skb_load_bytes(skb, 0, &s->hdr.inner, ETH_HLEN) < 0 ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + __builtin_offsetof(struct iphdr, tos), &tos, 1) < 0)
		return TUNNEL_PASS;
	/* Fails before changing anything on a packet encapsulated already. */
	if (bpf_skb_adjust_room(skb, CEL_VXLAN_ENCAP_LEN, BPF_ADJ_ROOM_MAC, flags) < 0)
		return TUNNEL_PASS;
	vxlan_fill(s, len, s->fib.ipv4_src, hash, port, tos);
	if (bpf_skb_store_bytes(skb, ETH_HLEN, &s->hdr, sizeof(s->hdr), 0) < 0 ||
	    bpf_skb_store_bytes(skb, __builtin_offsetof(struct ethhdr, h_proto), &outer_proto,
				sizeof(outer_proto), 0) < 0)
		return -CEL_REASON_ENCAP_FAILED;
	/* After the lookup ipv4_dst is the next hop. */
	__builtin_memset(&s->nh, 0, sizeof(s->nh));
	s->nh.nh_family = CEL_AF_INET;
	s->nh.ipv4_nh = s->fib.ipv4_dst;
	return bpf_redirect_neigh(s->fib.ifindex, &s->nh, sizeof(s->nh), 0);
}

/* Sends a packet tunnel_lookup found a node for: encapsulated by the
 * program (tunnel_encap), else through the VXLAN device with a tunnel key.
 * Returns the verdict, or -CEL_REASON_* to drop the packet with. */
static __always_inline int tunnel_send(struct __sk_buff *skb, const struct datapath_config *cfg)
{
	int ret;

	if (!cfg)
		return -CEL_REASON_ENCAP_FAILED;
	ret = skb->protocol == bpf_htons(ETH_P_IP) ? tunnel_encap(skb, cfg->tunnel_port) :
						      TUNNEL_PASS;
	if (ret != TUNNEL_PASS)
		return ret;
	ret = tunnel_set_key(skb);
	return ret ? -ret : bpf_redirect(cfg->tunnel_ifindex, 0);
}

/* Takes the outer headers off a VXLAN packet for a local pod (IPv4 UDP to
 * the tunnel's port, tunnel_own_packet4) when nothing the VXLAN device
 * would do to it is left undone (see the top of this file). Returns the
 * source identity the VNI carries (> 0) once the inner IPv4 packet is all
 * that is left, TUNNEL_PASS for the VXLAN device to take the packet,
 * unchanged, or -CEL_REASON_* (tunnel_identity) for a packet, unchanged,
 * whose VNI is not believed. Not inlined: its frame is gone before the
 * inner packet is handled. */
static __noinline int tunnel_decap(struct __sk_buff *skb, const struct datapath_config *cfg)
{
	const __u32 inner_ip = ETH_HLEN + CEL_VXLAN_ENCAP_LEN;
	struct tunnel_scratch *s = tunnel_scratch();
	struct vxlan_encap *h;
	__be32 daddr;
	int id;

	if (!s || !cfg || skb->gso_size)
		return TUNNEL_PASS;
	h = &s->hdr;
	if (bpf_skb_load_bytes(skb, ETH_HLEN, h, sizeof(*h)) < 0)
		return TUNNEL_PASS;
	if (h->ip.ihl != 5 || h->ip.frag_off & bpf_htons(CEL_IP_MF | CEL_IP_OFFSET) ||
	    (h->ip.tos & CEL_ECN_MASK) == CEL_ECN_CE ||
	    bpf_ntohs(h->ip.tot_len) != skb->len - ETH_HLEN ||
	    bpf_ntohs(h->udp.len) != skb->len - ETH_HLEN - sizeof(struct iphdr) || h->udp.check ||
	    h->vxlan.flags != bpf_htonl(CEL_VXLAN_FLAG_VNI) || h->vxlan.vni & bpf_htonl(0xff))
		return TUNNEL_PASS;
	/* Addressed to this node, as its VXLAN socket would take it. */
	if (ipcache_identity4(cfg, h->ip.daddr) != CEL_IDENTITY_HOST)
		return TUNNEL_PASS;
	/* Whatever the inner packet, before anything of it is believed. */
	id = tunnel_identity(cfg, h->ip.saddr, bpf_ntohl(h->vxlan.vni) >> 8);
	if (id < 0)
		return id;
	if (h->inner.h_proto != bpf_htons(ETH_P_IP) ||
	    bpf_skb_load_bytes(skb, inner_ip + __builtin_offsetof(struct iphdr, daddr), &daddr,
			       sizeof(daddr)) < 0 ||
	    !endpoint_lookup4(daddr))
		return TUNNEL_PASS;
	id = tunnel_inner_identity(skb, inner_ip, h->ip.saddr, id);
	/* The outer Ethernet header stays: it says IPv4 already. */
	if (bpf_skb_adjust_room(skb, -CEL_VXLAN_ENCAP_LEN, BPF_ADJ_ROOM_MAC,
				BPF_F_ADJ_ROOM_FIXED_GSO) < 0)
		return TUNNEL_PASS;
	return id;
}

#endif /* CELLIUM_LIB_TUNNEL_H */
