/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * ICMP and ICMPv6 errors that belong to a connection (Cilium's CT_RELATED):
 * destination unreachable (fragmentation needed included), time exceeded and
 * parameter problem, and ICMPv6's packet too big. An error quotes the packet
 * it is about; when that quote names a connection conntrack knows, the
 * error goes to the quoted packet's sender, and it comes from a party of the
 * connection, it is part of that connection: it passes as the connection's
 * own packets do, without policy and without an entry of its own. Any other
 * error goes on as today, a new flow that policy decides, so a forged error
 * opens nothing.
 *
 * A party: the quoted packet's destination (the connection's other end, the
 * backend as the load balancer translated it), or a router on the way. A pod
 * is never a router (its packets must carry its own source, and nothing is
 * routed through it), so an error from an endpoint, one of this node's or
 * one of a cluster identity, must come from the quoted destination: a pod
 * cannot end, or shrink the path MTU of, a connection it is no party of by
 * quoting its tuple. An error from anything else (this node, another node,
 * the world, a CIDR) may come from a router, as Cilium and netfilter accept.
 *
 * An error about a packet the service load balancer translated is
 * translated back, as netfilter's NAT does (nf_nat_icmp_reply_translation):
 * the client from outside its source was translated from becomes the
 * destination again (outer destination, quoted source and port), a port
 * moved off a clashing tuple is the client's own again, and the backend
 * becomes the frontend (quoted destination and port; the outer source too
 * when the backend itself sent the error, not a router on the way). The
 * client's stack then finds its socket, connected to the frontend, in the
 * quote: a UDP socket sees ECONNREFUSED, a path MTU is learnt for the
 * frontend's address.
 *
 * Checksums: the quoted IP header's and the quoted TCP/UDP checksum (when
 * the quote holds it; a UDP checksum of zero stays zero) are updated
 * incrementally over the rewritten addresses and ports, the ICMP checksum
 * by the difference of the whole quote (ICMPv6's also by its pseudo-header's
 * addresses), the outer IPv4 header's by its addresses.
 *
 * The quote is read defensively: a quote too short for its IP header and 8
 * bytes of L4 header, an IPv4 header with options, an IPv6 header followed by
 * an extension header, a quoted fragment, or an error quoting an error, is
 * no connection's (unrelated). Errors that are themselves fragments are too.
 *
 * All of it runs in BPF subprograms (icmp4_relate, icmp4_from_party,
 * icmp4_translate and IPv6's) with
 * their working space in a per-CPU map: only packets of an error type pay
 * for it, and its frame is off the callers'.
 */
#ifndef CELLIUM_LIB_RELATED_H
#define CELLIUM_LIB_RELATED_H

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "conntrack.h"
#include "ipv6.h"
#include "lb.h"
#include "lookup.h"
#include "maps.h"
#include "nd.h"
#include "packet.h"

/* What icmp4_related / icmp6_related decided (a positive value is a drop
 * reason: the error was related but could not be rewritten). */
#define CEL_RELATED_NONE -1     /* no connection's: goes on as a new flow */
#define CEL_RELATED 0           /* the connection's: delivered as its packets are */
#define CEL_RELATED_EXTERNAL -2 /* and now from a frontend reached from outside */
#define CEL_RELATED_TRANSLATE -3 /* internal: related, to be translated */

#define CEL_ICMP_TIME_EXCEEDED 11
#define CEL_ICMP_PARAM_PROBLEM 12
#define CEL_ICMP6_PACKET_TOO_BIG 2
#define CEL_ICMP6_TIME_EXCEEDED 3
#define CEL_ICMP6_PARAM_PROBLEM 4

/* Quoted bytes read: the IP header and 8 bytes of L4 header, or a whole TCP
 * header (20 bytes) when quoted, whose checksum is then updated too. */
#define CEL_QUOTE4_SHORT (20 + 8)
#define CEL_QUOTE4_LONG (20 + 20)
#define CEL_QUOTE6_SHORT (40 + 8)
#define CEL_QUOTE6_LONG (40 + 20)
#define CEL_QUOTE_MAX 64

struct related_scratch {
	__u8 old[CEL_QUOTE_MAX]; /* the quote as it came */
	__u8 buf[CEL_QUOTE_MAX]; /* and as rewritten */
	struct ct6_key key;      /* the quoted packet's tuple (IPv4: key4) */
	struct ct6_key rkey;     /* reversed */
	struct ct_key key4;
	struct ct_key rkey4;
	/* Copies kept off the stack: the subprograms run under the deepest
	 * frames of the IPv6 paths (netdev_to_pod6 among them). */
	struct snat6_value client6;
	struct snat4_value client4;
	struct lb6_key lb6;
	/* What the connection's entry says, and what the quote holds. */
	__u16 rev_nat_id;
	__be16 nat_port;
	__u8 snat; /* 1: client4/6 is the client from outside */
	__u8 len;  /* quoted bytes read */
	__u8 addr_old[16];
	__u8 addr_new[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct related_scratch);
	__uint(max_entries, 1);
} cel_related_scratch SEC(".maps");

/* Inline and cheap: whether the packet is an error worth the subprogram. */
static __always_inline int icmp4_is_error(const struct pkt *p)
{
	if (p->protocol != CEL_PROTO_ICMP || p->frag != CEL_FRAG_NONE)
		return 0;
	return p->icmp_type == 3 || p->icmp_type == CEL_ICMP_TIME_EXCEEDED ||
	       p->icmp_type == CEL_ICMP_PARAM_PROBLEM;
}

static __always_inline int icmp6_is_error(const struct pkt6 *p)
{
	return p->protocol == CEL_PROTO_ICMPV6 && p->frag == CEL_FRAG_NONE &&
	       p->icmp_type >= 1 && p->icmp_type <= CEL_ICMP6_PARAM_PROBLEM;
}

/* A 16-bit checksum field at `at` of buf, after the bytes it covers changed
 * by `diff` (bpf_csum_diff's result). `udp`: zero means "none" and stays. */
static __always_inline void quote_csum_fix(__u8 *buf, __u32 at, __s64 diff, int udp)
{
	__u16 check;

	if (at > CEL_QUOTE_MAX - 2)
		return;
	__builtin_memcpy(&check, &buf[at], 2);
	if (udp && !check)
		return;
	check = csum_fold32((__u64)(__u16)~check + (__u64)diff);
	if (udp && !check)
		check = 0xffff;
	__builtin_memcpy(&buf[at], &check, 2);
}

/* The quoted L4 header's ports (ICMP echo: the identifier, as parse_ipv4
 * places it) at `l4` of buf; -1 for a protocol no connection is tracked
 * with ports (an error about an error included). */
static __always_inline int quote_ports(const __u8 *buf, __u32 l4, __u8 protocol, __u8 echo_req,
				       __u8 echo_rep, __be16 *sport, __be16 *dport)
{
	if (l4 > CEL_QUOTE_MAX - 8)
		return -1;
	switch (protocol) {
	case CEL_PROTO_TCP:
	case CEL_PROTO_UDP:
	case CEL_PROTO_SCTP:
		__builtin_memcpy(sport, &buf[l4], 2);
		__builtin_memcpy(dport, &buf[l4 + 2], 2);
		return 0;
	case CEL_PROTO_ICMP:
	case CEL_PROTO_ICMPV6:
		*sport = 0;
		*dport = 0;
		if (buf[l4] == echo_req)
			__builtin_memcpy(sport, &buf[l4 + 4], 2);
		else if (buf[l4] == echo_rep)
			__builtin_memcpy(dport, &buf[l4 + 4], 2);
		else
			return -1;
		return 0;
	default:
		return -1;
	}
}

static __always_inline struct related_scratch *related_scratch(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&cel_related_scratch, &zero);
}

/* Whether conntrack entry `e` is live. */
static __always_inline int ct_live(const struct ct_entry *e, __u64 now)
{
	return e && e->expires_ns > now;
}

/*
 * Reads the quote of IPv4 error p into r (old and buf) and its tuple into
 * r->key4. Returns the bytes read (CEL_QUOTE4_SHORT or _LONG, the latter
 * when the quoted TCP checksum is there to update), or -1: unrelated.
 */
static __always_inline int quote4_read(struct __sk_buff *skb, const struct pkt *p,
				       struct related_scratch *r)
{
	__u32 off = p->l4_off + 8;
	int len = CEL_QUOTE4_SHORT;
	__be16 frag;

	if (bpf_skb_load_bytes(skb, off, r->old, CEL_QUOTE4_SHORT) < 0)
		return -1;
	/* Version 4 without options; no fragment. */
	if (r->old[0] != 0x45)
		return -1;
	__builtin_memcpy(&frag, &r->old[6], 2);
	if (frag & bpf_htons(CEL_IP_MF | CEL_IP_OFFSET))
		return -1;
	r->key4.protocol = r->old[9];
	__builtin_memcpy(&r->key4.saddr, &r->old[12], 4);
	__builtin_memcpy(&r->key4.daddr, &r->old[16], 4);
	if (quote_ports(r->old, 20, r->key4.protocol, CEL_ICMP_ECHO_REQUEST, CEL_ICMP_ECHO_REPLY,
			&r->key4.sport, &r->key4.dport) < 0)
		return -1;
	if (r->key4.protocol == CEL_PROTO_TCP && skb->len >= off + CEL_QUOTE4_LONG &&
	    bpf_skb_load_bytes(skb, off, r->old, CEL_QUOTE4_LONG) == 0)
		len = CEL_QUOTE4_LONG;
	__builtin_memcpy(r->buf, r->old, CEL_QUOTE_MAX);
	return len;
}

/* An outer IPv4 address (NAT_SRC or NAT_DST) becomes addr. */
static __always_inline int related4_outer(struct __sk_buff *skb, struct pkt *p, int which,
					  __be32 addr)
{
	__be32 *cur = which == NAT_DST ? &p->daddr : &p->saddr;
	__u32 off = ETH_HLEN + (which == NAT_DST ? __builtin_offsetof(struct iphdr, daddr)
						 : __builtin_offsetof(struct iphdr, saddr));

	if (*cur == addr)
		return 0;
	if (bpf_l3_csum_replace(skb, ETH_HLEN + __builtin_offsetof(struct iphdr, check), *cur,
				addr, sizeof(addr)) < 0 ||
	    bpf_skb_store_bytes(skb, off, &addr, sizeof(addr), 0) < 0)
		return -1;
	*cur = addr;
	return 0;
}

/* Writes the rewritten quote back: its IP header checksum, its L4 checksum
 * where quoted, then the ICMP checksum by the difference of the whole. */
static __always_inline int quote4_write(struct __sk_buff *skb, const struct pkt *p,
					struct related_scratch *r, int len)
{
	__u8 proto = r->key4.protocol;
	__s64 diff;

	/* Addresses (12..20) for the IP header; with the ports (20..24) for
	 * the L4 checksum, whose pseudo-header holds the addresses. */
	diff = bpf_csum_diff((__be32 *)&r->old[12], 8, (__be32 *)&r->buf[12], 8, 0);
	if (diff < 0)
		return -1;
	quote_csum_fix(r->buf, 10, diff, 0);
	diff = bpf_csum_diff((__be32 *)&r->old[12], 12, (__be32 *)&r->buf[12], 12, 0);
	if (diff < 0)
		return -1;
	if (proto == CEL_PROTO_UDP)
		quote_csum_fix(r->buf, 20 + 6, diff, 1);
	else if (proto == CEL_PROTO_TCP && len == CEL_QUOTE4_LONG)
		quote_csum_fix(r->buf, 20 + 16, diff, 0);

	if (len == CEL_QUOTE4_LONG) {
		diff = bpf_csum_diff((__be32 *)r->old, CEL_QUOTE4_LONG, (__be32 *)r->buf,
				     CEL_QUOTE4_LONG, 0);
		if (diff < 0 ||
		    bpf_skb_store_bytes(skb, p->l4_off + 8, r->buf, CEL_QUOTE4_LONG, 0) < 0)
			return -1;
	} else {
		diff = bpf_csum_diff((__be32 *)r->old, CEL_QUOTE4_SHORT, (__be32 *)r->buf,
				     CEL_QUOTE4_SHORT, 0);
		if (diff < 0 ||
		    bpf_skb_store_bytes(skb, p->l4_off + 8, r->buf, CEL_QUOTE4_SHORT, 0) < 0)
			return -1;
	}
	/* ICMP's checksum covers the message only: no pseudo-header. */
	return bpf_l4_csum_replace(skb, p->l4_off + 2, 0, diff, 0) < 0 ? -1 : 0;
}

/* Whether (addr, port, protocol) is a frontend reached from outside. */
static __always_inline int lb4_is_external(__be32 addr, __be16 port, __u8 protocol)
{
	struct lb4_key k = { .vip = addr, .dport = port, .protocol = protocol };
	struct lb4_service *svc = bpf_map_lookup_elem(&cel_lb4_services, &k);

	return svc && (svc->flags & CEL_SVC_F_EXTERNAL);
}

/*
 * The error's way back to the client of a translated connection: un-SNAT
 * (`client`, when the quoted source was the node's), the client's own port
 * (`ce`'s nat_port after a tuple clash), the frontend for the backend.
 * Returns CEL_RELATED, CEL_RELATED_EXTERNAL or CEL_REASON_NAT_FAILED.
 */
static __always_inline int related4_translate(struct __sk_buff *skb, struct pkt *p,
					      struct related_scratch *r)
{
	struct lb4_reverse_nat *rn = NULL;
	int external = 0;

	if (r->snat) {
		if (related4_outer(skb, p, NAT_DST, r->client4.addr) < 0)
			return CEL_REASON_NAT_FAILED;
		__builtin_memcpy(&r->buf[12], &r->client4.addr, 4);
		__builtin_memcpy(&r->buf[20], &r->client4.port, 2);
	}
	if (r->nat_port)
		__builtin_memcpy(&r->buf[20], &r->nat_port, 2);
	if (r->rev_nat_id)
		rn = bpf_map_lookup_elem(&cel_lb4_revnat, &r->rev_nat_id);
	if (rn) {
		__be32 vip = rn->vip;
		__be16 port = rn->port;

		/* The backend itself answered: from the frontend. A router on
		 * the way keeps its own address. */
		if (p->saddr == r->key4.daddr && related4_outer(skb, p, NAT_SRC, vip) < 0)
			return CEL_REASON_NAT_FAILED;
		__builtin_memcpy(&r->buf[16], &vip, 4);
		__builtin_memcpy(&r->buf[22], &port, 2);
		external = lb4_is_external(vip, port, r->key4.protocol);
	}
	if (!r->snat && !r->nat_port && !rn)
		return CEL_RELATED;
	if (quote4_write(skb, p, r, r->len) < 0)
		return CEL_REASON_NAT_FAILED;
	return external ? CEL_RELATED_EXTERNAL : CEL_RELATED;
}

static __always_inline void ct_key_reverse(struct ct_key *out, const struct ct_key *k)
{
	out->saddr = k->daddr;
	out->daddr = k->saddr;
	out->sport = k->dport;
	out->dport = k->sport;
	out->protocol = k->protocol;
}

/*
 * Whether IPv4 error p is related to a connection: CEL_RELATED_NONE,
 * CEL_RELATED (nothing to translate) or CEL_RELATED_TRANSLATE (the
 * scratch holds what icmp4_translate needs).
 */
static __noinline int icmp4_relate(struct __sk_buff *skb, struct pkt *p, int snat_only)
{
	struct related_scratch *r = related_scratch();
	struct snat4_value *client;
	struct ct_entry *ce;
	__u64 now;
	int len;

	if (!r)
		return CEL_RELATED_NONE;
	__builtin_memset(&r->key4, 0, sizeof(r->key4));
	__builtin_memset(&r->rkey4, 0, sizeof(r->rkey4));
	len = quote4_read(skb, p, r);
	if (len < 0)
		return CEL_RELATED_NONE;
	ct_key_reverse(&r->rkey4, &r->key4);
	/* An error goes to the sender of the packet it quotes. */
	if (p->daddr != r->key4.saddr)
		return CEL_RELATED_NONE;
	now = bpf_ktime_get_ns();
	/* Its client, who may be a client from outside whose source this
	 * node translated. */
	client = bpf_map_lookup_elem(&cel_snat4, &r->rkey4);
	if (snat_only && !client)
		return CEL_RELATED_NONE;
	r->snat = client != NULL;
	if (client) {
		r->client4 = *client;
		r->key4.saddr = r->client4.addr;
		r->key4.sport = r->client4.port;
	}
	ce = bpf_map_lookup_elem(&cel_ct4, &r->key4);
	if (!ct_live(ce, now)) {
		/* About a reply: the error goes the connection's original
		 * way, untranslated (an error to a frontend is not balanced). */
		if (client)
			return CEL_RELATED_NONE;
		ce = bpf_map_lookup_elem(&cel_ct4, &r->rkey4);
		return ct_live(ce, now) ? CEL_RELATED : CEL_RELATED_NONE;
	}
	r->rev_nat_id = ce->rev_nat_id;
	r->nat_port = ce->nat_port;
	r->len = len;
	return CEL_RELATED_TRANSLATE;
}

static __noinline int icmp4_translate(struct __sk_buff *skb, struct pkt *p)
{
	struct related_scratch *r = related_scratch();

	if (!r)
		return CEL_REASON_NAT_FAILED;
	return related4_translate(skb, p, r);
}

/* Whether an identity is a pod's: a cluster identity (Cilium's 256 to
 * 65535); reserved and CIDR (node-local) identities are not. */
static __always_inline int identity_is_pod(__u32 identity)
{
	return identity >= 256 && identity <= 65535;
}

/*
 * Whether the sender of related IPv4 error p (the quote in the scratch) is
 * a party of its connection: the quoted destination, or no endpoint (this
 * node's endpoints by address, whatever their identity; others by
 * `sender`, the sender's identity, or the ipcache's when 0). A subprogram
 * of its own beside icmp4_relate, not under it: the verifier sums the
 * frames of a call chain.
 */
static __noinline int icmp4_from_party(const struct pkt *p, __u32 sender)
{
	struct related_scratch *r = related_scratch();

	if (!r)
		return 0;
	if (p->saddr == r->key4.daddr)
		return 1;
	if (endpoint_lookup4(p->saddr))
		return 0;
	return !identity_is_pod(sender ?: ipcache_identity4(NULL, p->saddr));
}

/*
 * IPv4 error p (icmp4_is_error): whether it is related to a connection, and
 * if so translated back as above. With `snat_only`, only an error quoting a
 * packet whose source this node translated (another node's backend's error,
 * on the node's device) is considered. `sender` is the sender's identity,
 * 0 to take it from the ipcache. Returns CEL_RELATED_NONE, CEL_RELATED,
 * CEL_RELATED_EXTERNAL or a drop reason. Subprograms, each with a small
 * frame: they run under cel_from_container's.
 */
static __always_inline int icmp4_related(struct __sk_buff *skb, struct pkt *p, int snat_only,
					 __u32 sender)
{
	int ret = icmp4_relate(skb, p, snat_only);

	if (ret == CEL_RELATED_NONE || !icmp4_from_party(p, sender))
		return CEL_RELATED_NONE;
	return ret == CEL_RELATED_TRANSLATE ? icmp4_translate(skb, p) : ret;
}

/* quote4_read for IPv6: the quoted IPv6 header must be followed by its
 * upper layer directly (an extension header makes it unrelated). */
static __always_inline int quote6_read(struct __sk_buff *skb, const struct pkt6 *p,
				       struct related_scratch *r)
{
	__u32 off = p->l4_off + 8;
	int len = CEL_QUOTE6_SHORT;

	if (bpf_skb_load_bytes(skb, off, r->old, CEL_QUOTE6_SHORT) < 0)
		return -1;
	if ((r->old[0] >> 4) != 6)
		return -1;
	r->key.protocol = r->old[6];
	__builtin_memcpy(r->key.saddr, &r->old[8], 16);
	__builtin_memcpy(r->key.daddr, &r->old[24], 16);
	if (quote_ports(r->old, 40, r->key.protocol, CEL_ICMP6_ECHO_REQUEST, CEL_ICMP6_ECHO_REPLY,
			&r->key.sport, &r->key.dport) < 0)
		return -1;
	if (r->key.protocol == CEL_PROTO_TCP && skb->len >= off + CEL_QUOTE6_LONG &&
	    bpf_skb_load_bytes(skb, off, r->old, CEL_QUOTE6_LONG) == 0)
		len = CEL_QUOTE6_LONG;
	__builtin_memcpy(r->buf, r->old, CEL_QUOTE_MAX);
	return len;
}

/* An outer IPv6 address becomes addr; ICMPv6's checksum covers it (its
 * pseudo-header). */
static __always_inline int related6_outer(struct __sk_buff *skb, struct pkt6 *p, int which,
					  const __u8 *addr, struct related_scratch *r)
{
	__u8 *cur = which == NAT_DST ? p->daddr : p->saddr;
	__u32 off = ETH_HLEN + (which == NAT_DST ? __builtin_offsetof(struct ipv6hdr, daddr)
						 : __builtin_offsetof(struct ipv6hdr, saddr));
	__s64 diff;

	__builtin_memcpy(r->addr_old, cur, 16);
	__builtin_memcpy(r->addr_new, addr, 16);
	diff = bpf_csum_diff((__be32 *)r->addr_old, 16, (__be32 *)r->addr_new, 16, 0);
	if (diff < 0 ||
	    bpf_l4_csum_replace(skb, p->l4_off + 2, 0, diff, BPF_F_PSEUDO_HDR) < 0 ||
	    bpf_skb_store_bytes(skb, off, r->addr_new, 16, 0) < 0)
		return -1;
	__builtin_memcpy(cur, r->addr_new, 16);
	return 0;
}

/* quote4_write for IPv6: no IP header checksum; the L4 checksum's
 * pseudo-header holds the addresses (8..40), followed by the ports. */
static __always_inline int quote6_write(struct __sk_buff *skb, const struct pkt6 *p,
					struct related_scratch *r, int len)
{
	__u8 proto = r->key.protocol;
	__s64 diff;

	diff = bpf_csum_diff((__be32 *)&r->old[8], 36, (__be32 *)&r->buf[8], 36, 0);
	if (diff < 0)
		return -1;
	if (proto == CEL_PROTO_UDP)
		quote_csum_fix(r->buf, 40 + 6, diff, 1);
	else if (proto == CEL_PROTO_TCP && len == CEL_QUOTE6_LONG)
		quote_csum_fix(r->buf, 40 + 16, diff, 0);

	if (len == CEL_QUOTE6_LONG) {
		diff = bpf_csum_diff((__be32 *)r->old, CEL_QUOTE6_LONG, (__be32 *)r->buf,
				     CEL_QUOTE6_LONG, 0);
		if (diff < 0 ||
		    bpf_skb_store_bytes(skb, p->l4_off + 8, r->buf, CEL_QUOTE6_LONG, 0) < 0)
			return -1;
	} else {
		diff = bpf_csum_diff((__be32 *)r->old, CEL_QUOTE6_SHORT, (__be32 *)r->buf,
				     CEL_QUOTE6_SHORT, 0);
		if (diff < 0 ||
		    bpf_skb_store_bytes(skb, p->l4_off + 8, r->buf, CEL_QUOTE6_SHORT, 0) < 0)
			return -1;
	}
	return bpf_l4_csum_replace(skb, p->l4_off + 2, 0, diff, 0) < 0 ? -1 : 0;
}

static __always_inline int lb6_is_external(const __u8 *addr, __be16 port, __u8 protocol,
					   struct lb6_key *k)
{
	struct lb4_service *svc;

	__builtin_memset(k, 0, sizeof(*k));
	__builtin_memcpy(k->vip, addr, 16);
	k->dport = port;
	k->protocol = protocol;
	svc = bpf_map_lookup_elem(&cel_lb6_services, k);
	return svc && (svc->flags & CEL_SVC_F_EXTERNAL);
}

/* related4_translate for IPv6. */
static __always_inline int related6_translate(struct __sk_buff *skb, struct pkt6 *p,
					      struct related_scratch *r)
{
	struct lb6_reverse_nat *rn = NULL;
	int external = 0;

	if (r->snat) {
		if (related6_outer(skb, p, NAT_DST, r->client6.addr, r) < 0)
			return CEL_REASON_NAT_FAILED;
		__builtin_memcpy(&r->buf[8], r->client6.addr, 16);
		__builtin_memcpy(&r->buf[40], &r->client6.port, 2);
	}
	if (r->nat_port)
		__builtin_memcpy(&r->buf[40], &r->nat_port, 2);
	if (r->rev_nat_id)
		rn = bpf_map_lookup_elem(&cel_lb6_revnat, &r->rev_nat_id);
	if (rn) {
		__be16 port = rn->port;

		if (ipv6_equal(p->saddr, r->key.daddr) &&
		    related6_outer(skb, p, NAT_SRC, rn->vip, r) < 0)
			return CEL_REASON_NAT_FAILED;
		__builtin_memcpy(&r->buf[24], rn->vip, 16);
		__builtin_memcpy(&r->buf[42], &port, 2);
		external = lb6_is_external(rn->vip, port, r->key.protocol, &r->lb6);
	}
	if (!r->snat && !r->nat_port && !rn)
		return CEL_RELATED;
	if (quote6_write(skb, p, r, r->len) < 0)
		return CEL_REASON_NAT_FAILED;
	return external ? CEL_RELATED_EXTERNAL : CEL_RELATED;
}

static __always_inline void ct6_key_reverse(struct ct6_key *out, const struct ct6_key *k)
{
	__builtin_memcpy(out->saddr, k->daddr, 16);
	__builtin_memcpy(out->daddr, k->saddr, 16);
	out->sport = k->dport;
	out->dport = k->sport;
	out->protocol = k->protocol;
}

/* icmp4_relate for IPv6 errors (icmp6_is_error), in two subprograms:
 * reading the quote (icmp6_quote), then the lookups. */
static __noinline int icmp6_quote(struct __sk_buff *skb, const struct pkt6 *p)
{
	struct related_scratch *r = related_scratch();
	int len;

	if (!r)
		return -1;
	__builtin_memset(&r->key, 0, sizeof(r->key));
	__builtin_memset(&r->rkey, 0, sizeof(r->rkey));
	len = quote6_read(skb, p, r);
	if (len < 0)
		return -1;
	ct6_key_reverse(&r->rkey, &r->key);
	r->len = len;
	return 0;
}

static __noinline int icmp6_relate(const struct pkt6 *p, int snat_only)
{
	struct related_scratch *r = related_scratch();
	struct snat6_value *client;
	struct ct_entry *ce;
	__u64 now;

	if (!r)
		return CEL_RELATED_NONE;
	if (!ipv6_equal(p->daddr, r->key.saddr))
		return CEL_RELATED_NONE;
	now = bpf_ktime_get_ns();
	client = bpf_map_lookup_elem(&cel_snat6, &r->rkey);
	if (snat_only && !client)
		return CEL_RELATED_NONE;
	r->snat = client != NULL;
	if (client) {
		r->client6 = *client;
		__builtin_memcpy(r->key.saddr, r->client6.addr, 16);
		r->key.sport = r->client6.port;
	}
	ce = bpf_map_lookup_elem(&cel_ct6, &r->key);
	if (!ct_live(ce, now)) {
		/* As for IPv4: about a reply, the original way. */
		if (client)
			return CEL_RELATED_NONE;
		ce = bpf_map_lookup_elem(&cel_ct6, &r->rkey);
		return ct_live(ce, now) ? CEL_RELATED : CEL_RELATED_NONE;
	}
	r->rev_nat_id = ce->rev_nat_id;
	r->nat_port = ce->nat_port;
	return CEL_RELATED_TRANSLATE;
}

static __noinline int icmp6_translate(struct __sk_buff *skb, struct pkt6 *p)
{
	struct related_scratch *r = related_scratch();

	if (!r)
		return CEL_REASON_NAT_FAILED;
	return related6_translate(skb, p, r);
}

/* icmp4_from_party for IPv6. */
static __noinline int icmp6_from_party(const struct pkt6 *p, __u32 sender)
{
	struct related_scratch *r = related_scratch();

	if (!r)
		return 0;
	if (ipv6_equal(p->saddr, r->key.daddr))
		return 1;
	if (endpoint_lookup6(p->saddr))
		return 0;
	return !identity_is_pod(sender ?: ipcache_identity6(NULL, p->saddr));
}

/* icmp4_related for IPv6. */
static __always_inline int icmp6_related(struct __sk_buff *skb, struct pkt6 *p, int snat_only,
					 __u32 sender)
{
	int ret;

	if (icmp6_quote(skb, p) < 0)
		return CEL_RELATED_NONE;
	ret = icmp6_relate(p, snat_only);
	if (ret == CEL_RELATED_NONE || !icmp6_from_party(p, sender))
		return CEL_RELATED_NONE;
	return ret == CEL_RELATED_TRANSLATE ? icmp6_translate(skb, p) : ret;
}

#endif /* CELLIUM_LIB_RELATED_H */
