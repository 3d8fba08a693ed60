/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * ClusterIP: DNAT of a client's packet to a backend, and reverse NAT of the
 * backend's replies. The backend of a connection is chosen once (lb4_select:
 * the client's session affinity, else the frontend's maglev table if it has
 * one, else at random among the service's slots), and remembered in a service
 * conntrack entry keyed on the client -> VIP tuple, so later packets never
 * re-balance. That entry is written only after policy allowed the connection: denied
 * attempts cannot fill the shared table and evict other connections.
 */
#ifndef CELLIUM_LIB_LB_H
#define CELLIUM_LIB_LB_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "conntrack.h"
#include "maps.h"
#include "nat.h"
#include "packet.h"

/*
 * A port translation alone (tuple clashes, lb4_unclash): the port and the L4
 * checksum, the addresses untouched; a later fragment has no L4 header to
 * change. Returns 0 or CEL_REASON_NAT_FAILED.
 */
static __always_inline int lb_port_rewrite(struct __sk_buff *skb, __u8 protocol, __u16 l4_off,
					   __u8 frag, int which, __be16 old_port, __be16 port)
{
	__u32 csum_off = 0;
	__u64 mangled = 0;

	if (frag == CEL_FRAG_LATER || old_port == port)
		return 0;
	if (nat_l4_csum(protocol, l4_off, &csum_off, &mangled) < 0)
		return CEL_REASON_NAT_FAILED;
	if (bpf_l4_csum_replace(skb, csum_off, old_port, port, mangled | sizeof(port)) < 0)
		return CEL_REASON_NAT_FAILED;
	if (bpf_skb_store_bytes(skb, l4_off + (which == NAT_DST ? 2 : 0), &port, sizeof(port), 0) <
	    0)
		return CEL_REASON_NAT_FAILED;
	return 0;
}

static __always_inline int lb4_port_rewrite(struct __sk_buff *skb, struct pkt *p, int which,
					    __be16 port)
{
	__be16 *cur = which == NAT_DST ? &p->dport : &p->sport;
	int ret = lb_port_rewrite(skb, p->protocol, p->l4_off, p->frag, which, *cur, port);

	if (!ret)
		*cur = port;
	return ret;
}

static __always_inline int lb6_port_rewrite(struct __sk_buff *skb, struct pkt6 *p, int which,
					    __be16 port)
{
	__be16 *cur = which == NAT_DST ? &p->dport : &p->sport;
	int ret = lb_port_rewrite(skb, p->protocol, p->l4_off, p->frag, which, *cur, port);

	if (!ret)
		*cur = port;
	return ret;
}

/*
 * What the frontend lookup decided for one packet: the backend it goes to,
 * and whether the connection still has to remember that backend. The
 * service entry is written by lb4_commit only once policy let the
 * connection through, so a denied connection leaves no state behind.
 */
struct lb4_choice {
	struct ct_key skey;   /* client -> frontend, CEL_CT_F_SERVICE */
	__u32 backend_id;     /* 0: not a frontend */
	__u16 rev_nat_id;
	__u8 commit;          /* 1: no live service entry names backend_id yet */
	__u8 affinity;        /* 1: the frontend has session affinity */
	__be16 nat_sport;     /* tuple clash: the source port given (0: none) */
	__be16 orig_sport;    /* and the client's own */
};

/*
 * The connection hash maglev indexes its table with: a murmur3-style mix of
 * the client -> frontend 5-tuple with a fixed seed, so that every node (and
 * every agent version) hashes a flow alike and picks the same backend.
 */
static __always_inline __u32 lb_hash_mix(__u32 h, __u32 w)
{
	w *= 0xcc9e2d51;
	w = (w << 15) | (w >> 17);
	w *= 0x1b873593;
	h ^= w;
	h = (h << 13) | (h >> 19);
	return h * 5 + 0xe6546b64;
}

static __always_inline __u32 lb_hash_final(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

static __always_inline __u32 lb_hash_ports(__u32 h, __be16 sport, __be16 dport, __u8 protocol)
{
	h = lb_hash_mix(h, ((__u32)sport << 16) | dport);
	return lb_hash_final(lb_hash_mix(h, protocol));
}

static __always_inline __u32 lb4_hash(const struct pkt *p)
{
	__u32 h = CEL_LB_MAGLEV_SEED;

	h = lb_hash_mix(h, p->saddr);
	h = lb_hash_mix(h, p->daddr);
	return lb_hash_ports(h, p->sport, p->dport, p->protocol);
}

_Static_assert(__builtin_offsetof(struct pkt6, daddr) == __builtin_offsetof(struct pkt6, saddr) + 16,
	       "lb6_hash reads the destination right after the source");

static __always_inline __u32 lb6_hash(const struct pkt6 *p)
{
	/* The source then the destination, word by word from the packet (both
	 * 4-byte aligned and adjacent in struct pkt6, asserted below), in a loop
	 * kept rolled: unrolled, the words' mixes are computed side by side and
	 * spill to the stack. */
	const __u32 *w = (const __u32 *)p->saddr;
	__u32 h = CEL_LB_MAGLEV_SEED;
	int i;

#pragma clang loop unroll(disable)
	for (i = 0; i < 8; i++)
		h = lb_hash_mix(h, w[i]);
	return lb_hash_ports(h, p->sport, p->dport, p->protocol);
}

/* The backend id the frontend's maglev table gives a connection hashing to
 * `hash`; 0 when the frontend has no table (it is balanced at random). */
static __always_inline __u32 lb_maglev_pick(__u16 rev_nat_id, __u32 hash)
{
	__u32 key = CEL_LB_MAGLEV_SIZE_KEY, *size, *id;
	void *table;
	__u32 m;

	table = bpf_map_lookup_elem(&cel_lb_maglev, &rev_nat_id);
	if (!table)
		return 0;
	size = bpf_map_lookup_elem(table, &key);
	if (!size)
		return 0;
	m = *size;
	if (!m)
		return 0;
	key = 1 + hash % m;
	id = bpf_map_lookup_elem(table, &key);
	return id ? *id : 0;
}

/* Whether backend `id` is still one of the frontend's, for session affinity. */
static __always_inline int lb_affinity_member(__u32 id, __u16 rev_nat_id)
{
	struct lb_affinity_match m = { .backend_id = id, .rev_nat_id = rev_nat_id };

	return bpf_map_lookup_elem(&cel_lb_affinity_match, &m) != NULL;
}

/* Whether a client's affinity entry, if any, still holds at `now` for a
 * frontend of `timeout` seconds; its backend id if so, else 0. */
static __always_inline __u32 lb_affinity_live(const struct lb_affinity_val *v, __u32 timeout,
					      __u16 rev_nat_id, __u64 now)
{
	__u32 id;

	if (!v || v->last_used_ns + (__u64)timeout * CEL_NSEC_PER_SEC <= now)
		return 0;
	id = v->backend_id;
	return lb_affinity_member(id, rev_nat_id) ? id : 0;
}

/*
 * The backend a new connection to a frontend of `count` (> 0) slots takes:
 * with session affinity (`affinity_timeout` seconds, 0 = none), the one the
 * client's last new connection took if that was within the timeout and it is
 * still the frontend's; else its maglev table's; else a slot at random (also
 * when the table names a backend that is gone, which the sync never leaves
 * for long). `key` is the
 * frontend's; its slot is overwritten. Returns the backend id, 0 if none.
 */
static __always_inline __u32 lb4_select(struct lb4_key *key, __u16 count, __u16 rev_nat_id,
					__u32 affinity_timeout, const struct pkt *p, __u64 now)
{
	struct lb4_affinity_key akey = { .client = p->saddr, .rev_nat_id = rev_nat_id };
	struct lb4_service *slot;
	__u32 id = 0;

	if (affinity_timeout)
		id = lb_affinity_live(bpf_map_lookup_elem(&cel_lb4_affinity, &akey),
				      affinity_timeout, rev_nat_id, now);
	if (!id)
		id = lb_maglev_pick(rev_nat_id, lb4_hash(p));
	if (id && bpf_map_lookup_elem(&cel_lb4_backends, &id))
		return id;
	key->slot = (bpf_get_prandom_u32() % count) + 1;
	slot = bpf_map_lookup_elem(&cel_lb4_services, key);
	return slot ? slot->backend_id : 0;
}

/* lb4_select for IPv6 frontends. */
static __always_inline __u32 lb6_select(struct lb6_key *key, __u16 count, __u16 rev_nat_id,
					__u32 affinity_timeout, const struct pkt6 *p, __u64 now)
{
	struct lb6_affinity_key akey = { .rev_nat_id = rev_nat_id };
	struct lb4_service *slot;
	__u32 id = 0;

	if (affinity_timeout) {
		__builtin_memcpy(akey.client, p->saddr, 16);
		id = lb_affinity_live(bpf_map_lookup_elem(&cel_lb6_affinity, &akey),
				      affinity_timeout, rev_nat_id, now);
	}
	if (!id)
		id = lb_maglev_pick(rev_nat_id, lb6_hash(p));
	if (id && bpf_map_lookup_elem(&cel_lb6_backends, &id))
		return id;
	key->slot = (bpf_get_prandom_u32() % count) + 1;
	slot = bpf_map_lookup_elem(&cel_lb6_services, key);
	return slot ? slot->backend_id : 0;
}

/*
 * loadBalancerSourceRanges: whether the frontend `rev_nat_id` admits a new
 * connection from `client`. In frames of their own (the key off the
 * callers' frames: cel_from_container's leaves its callees little of the
 * verifier's 512 bytes).
 */
static __noinline int lb4_src_range_ok(__u32 rev_nat_id, __be32 client)
{
	struct lb4_src_range_key k = {
		.prefixlen = CEL_LB_SRC_RANGE_STATIC_PREFIX + 32,
		.rev_nat_id = (__u16)rev_nat_id,
		.addr = client,
	};

	return bpf_map_lookup_elem(&cel_lb4_source_range, &k) != NULL;
}

static __noinline int lb6_src_range_ok(__u32 rev_nat_id, const __u8 *client)
{
	struct lb6_src_range_key k = {
		.prefixlen = CEL_LB_SRC_RANGE_STATIC_PREFIX + 128,
		.rev_nat_id = (__u16)rev_nat_id,
	};

	if (!client)
		return 0;
	__builtin_memcpy(k.addr, client, 16);
	return bpf_map_lookup_elem(&cel_lb6_source_range, &k) != NULL;
}

/*
 * If the packet is for a frontend, translates it to the connection's
 * backend and fills `c`. A connection without a live service entry gets a
 * backend from lb4_select and nothing written: lb4_commit records the
 * choice once the connection is allowed. Returns 0 or a drop reason.
 */
static __always_inline int lb4_dnat(struct __sk_buff *skb, struct pkt *p,
				    const struct datapath_config *cfg, __u64 now,
				    struct lb4_choice *c)
{
	struct lb4_key key = {};
	struct lb4_service *svc;
	struct lb4_backend *be = NULL;
	struct ct_pkt cp = ct_pkt4(p);
	struct ct_entry *se;
	__u32 id = 0, timeout;
	__u16 count, rnat;
	__be16 nat_port = 0;
	__be32 addr;
	__be16 port;
	int ret;

	if (p->protocol != CEL_PROTO_TCP && p->protocol != CEL_PROTO_UDP)
		return 0;
	key.vip = p->daddr;
	key.dport = p->dport;
	key.protocol = p->protocol;
	svc = bpf_map_lookup_elem(&cel_lb4_services, &key);
	if (!svc)
		return 0;
	count = svc->count;
	rnat = svc->rev_nat_id;
	timeout = svc->backend_id; /* slot 0: the affinity timeout */

	ct_key_from_pkt(&c->skey, p, CEL_CT_F_SERVICE);
	se = bpf_map_lookup_elem(&cel_ct4, &c->skey);
	if (se && se->expires_ns > now && !ct_is_reopen(se, &cp)) {
		id = se->backend_id;
		be = bpf_map_lookup_elem(&cel_lb4_backends, &id);
		if (be) {
			ct_account(se, CEL_CT_FORWARD, &cp, cfg, now);
			nat_port = se->nat_port;
		}
	}
	/* New connection, or its backend was removed: choose (again). */
	if (!be) {
		if ((svc->flags & CEL_SVC_F_SOURCE_RANGE) && !lb4_src_range_ok(rnat, p->saddr))
			return CEL_REASON_NOT_IN_SRC_RANGE;
		if (count == 0)
			return CEL_REASON_NO_SERVICE_BACKEND;
		id = lb4_select(&key, count, rnat, timeout, p, now);
		be = bpf_map_lookup_elem(&cel_lb4_backends, &id);
		if (!be)
			return CEL_REASON_NO_SERVICE_BACKEND;
		c->commit = 1;
		c->affinity = timeout != 0;
	}

	addr = be->addr;
	port = be->port;
	c->rev_nat_id = rnat;
	c->backend_id = id;
	ret = nat4_rewrite(skb, p, NAT_DST, addr, port);
	/* A connection moved off a clashing tuple keeps its source port. */
	if (ret || !nat_port)
		return ret;
	return lb4_port_rewrite(skb, p, NAT_SRC, nat_port);
}

/*
 * Tuple clash: a new service connection whose translated tuple (client ->
 * backend) is a live connection's already, of another frontend or of none
 * (the same client port to two services of one backend, or to the backend
 * directly and through its cluster IP), would reach the backend as that
 * connection's packets. Such a connection gets another source port, as
 * netfilter's NAT does, from 61000-65535 (outside Linux's default ephemeral
 * range, so rarely one the client picks itself); its service entry keeps the
 * port for its later packets and its translated entry the client's own for
 * its replies (lb4_restore_port).
 */
#define CEL_LB_CLASH_PORT_MIN 61000
#define CEL_LB_CLASH_PORTS 4536
#define CEL_LB_CLASH_TRIES 8

/* Whether the tuple `k` is a live connection other than one of `rev_nat_id`
 * (any live connection when `rev_nat_id` is 0). */
static __always_inline int lb4_taken(const struct ct_key *k, __u16 rev_nat_id, __u64 now)
{
	struct ct_entry *e = bpf_map_lookup_elem(&cel_ct4, k);

	/* A closing TCP connection's tuple is free: conntrack takes a SYN on it
	 * as a new connection (ct_is_reopen), as netfilter does. Counting it
	 * would move every reused client port into the clash range, which a
	 * burst of short connections exhausts. */
	return e && e->expires_ns > now && e->state != CEL_CT_STATE_CLOSING &&
	       (!rev_nat_id || e->rev_nat_id != rev_nat_id);
}

/* After lb4_dnat and lb4_hairpin: moves a new connection off a clashing
 * tuple. `k` is scratch space for a key (the caller's, to spare the stack).
 * Returns 0 or a drop reason. */
static __noinline int lb4_unclash(struct __sk_buff *skb, struct pkt *p,
				       struct lb4_choice *c, struct ct_key *k, __u64 now)
{
	__u32 h, i;

	if (!c->commit)
		return 0;
	ct_key_from_pkt(k, p, 0);
	if (!lb4_taken(k, c->rev_nat_id, now))
		return 0;
	h = bpf_get_prandom_u32();
	for (i = 0; i < CEL_LB_CLASH_TRIES; i++) {
		k->sport = bpf_htons(CEL_LB_CLASH_PORT_MIN + (h + i) % CEL_LB_CLASH_PORTS);
		if (!lb4_taken(k, 0, now)) {
			c->orig_sport = p->sport;
			c->nat_sport = k->sport;
			return lb4_port_rewrite(skb, p, NAT_SRC, k->sport);
		}
	}
	return CEL_REASON_NAT_FAILED;
}

/* Records on the translated connection's entry `key` the client port its
 * replies get back. */
static __noinline void lb4_set_nat_port(const struct ct_key *key, __be16 port)
{
	struct ct_entry *e = bpf_map_lookup_elem(&cel_ct4, key);

	if (e)
		e->nat_port = port;
}

static __always_inline void lb4_note_clash(const struct ct_key *key, const struct lb4_choice *c)
{
	if (c->nat_sport)
		lb4_set_nat_port(key, c->orig_sport);
}

/* A reply of a connection moved off a clashing tuple: back to the client's
 * own port. Returns 0 or a drop reason. */
static __always_inline int lb4_restore_port(struct __sk_buff *skb, struct pkt *p,
					    const struct ct_entry *ce)
{
	__be16 port = ce->nat_port;

	if (!port)
		return 0;
	return lb4_port_rewrite(skb, p, NAT_DST, port) ? CEL_REASON_NAT_FAILED : 0;
}

/*
 * Hairpin: a pod whose connection to its own service is balanced to itself
 * would receive its packet with its own address as the source, which its
 * stack drops as a martian (and would answer over lo besides). Such a
 * connection's source becomes the loopback address instead (Cilium's
 * IPV4_LOOPBACK, 169.254.42.1, which no node or pod holds), so the pod's
 * replies leave through its veth, where lb4_hairpin_reply gives them back
 * their destination before the reverse translation.
 */
#define CEL_LB4_LOOPBACK bpf_htonl(0xa9fe2a01)

/* After lb4_dnat: the source translation of a connection balanced back to
 * its own client. Returns 0 or a drop reason. */
static __always_inline int lb4_hairpin(struct __sk_buff *skb, struct pkt *p,
				       const struct lb4_choice *c)
{
	if (!c->backend_id || p->saddr != p->daddr)
		return 0;
	return nat4_rewrite(skb, p, NAT_SRC, CEL_LB4_LOOPBACK, p->sport);
}

/* A reply of a translated connection sent to the loopback address: its
 * client is the pod sending it, which becomes the destination again. Returns
 * 1 if the packet was such a reply, 0 if not, or -1 if it could not be
 * rewritten. */
static __always_inline int lb4_hairpin_reply(struct __sk_buff *skb, struct pkt *p)
{
	if (p->daddr != CEL_LB4_LOOPBACK)
		return 0;
	return nat4_rewrite(skb, p, NAT_DST, p->saddr, p->dport) ? -1 : 1;
}

/*
 * Records the backend chosen by lb4_dnat for a connection that policy
 * allowed (or that conntrack already knows), so its later packets keep it.
 * Returns 0 or CEL_REASON_CT_FULL.
 */
static __always_inline int lb4_commit(const struct lb4_choice *c, const struct pkt *p,
				      const struct datapath_config *cfg, __u64 now)
{
	/* The client as it sent the packet (a hairpin has translated p's). */
	struct lb4_affinity_key akey = { .client = c->skey.saddr, .rev_nat_id = c->rev_nat_id };
	struct lb_affinity_val av = { .last_used_ns = now, .backend_id = c->backend_id };
	int ret;

	if (!c->commit)
		return 0;
	ret = ct_create4(&c->skey, p, cfg, now, c->rev_nat_id, c->backend_id);
	if (!ret && c->nat_sport)
		lb4_set_nat_port(&c->skey, c->nat_sport);
	/* Every new connection renews the client's affinity, as kube-proxy's
	 * "recent" match does: the timeout runs from the last one. */
	if (!ret && c->affinity)
		bpf_map_update_elem(&cel_lb4_affinity, &akey, &av, BPF_ANY);
	return ret;
}

/*
 * Rewrites a backend's reply so that its source is the frontend again, and
 * keeps the service entry alive with it. Returns 0 or a drop reason.
 */
static __always_inline int lb4_rev_nat(struct __sk_buff *skb, struct pkt *p, __u16 rev_nat_id,
				       const struct datapath_config *cfg, __u64 now)
{
	struct lb4_reverse_nat *rn = bpf_map_lookup_elem(&cel_lb4_revnat, &rev_nat_id);
	struct ct_key skey = {};
	struct ct_entry *se;
	__be32 vip;
	__be16 port;

	/* The service is gone: the client gets the backend's address and
	 * resets, exactly as if the connection had never been balanced. */
	if (!rn)
		return 0;
	vip = rn->vip;
	port = rn->port;

	skey.saddr = p->daddr;
	skey.daddr = vip;
	skey.sport = p->dport;
	skey.dport = port;
	skey.protocol = p->protocol;
	skey.flags = CEL_CT_F_SERVICE;
	se = bpf_map_lookup_elem(&cel_ct4, &skey);
	if (se) {
		struct ct_pkt cp = ct_pkt4(p);

		ct_account(se, CEL_CT_REPLY, &cp, cfg, now);
	}

	return nat4_rewrite(skb, p, NAT_SRC, vip, port);
}

/* lb4_choice for IPv6. */
struct lb6_choice {
	struct ct6_key skey; /* client -> frontend, CEL_CT_F_SERVICE */
	__u32 backend_id;    /* 0: not a frontend */
	__u16 rev_nat_id;
	__u8 commit;
	__u8 affinity;
	__be16 nat_sport;
	__be16 orig_sport;
};

/* lb4_dnat for IPv6 frontends (cel_lb6_*, conntrack in cel_ct6). */
static __always_inline int lb6_dnat(struct __sk_buff *skb, struct pkt6 *p,
				    const struct datapath_config *cfg, __u64 now,
				    struct lb6_choice *c)
{
	struct lb6_key key = {};
	struct lb4_service *svc;
	struct lb6_backend *be = NULL;
	struct ct_pkt cp = ct_pkt6(p);
	struct ct_entry *se;
	__u8 addr[16];
	__u32 id = 0, timeout;
	__u16 count, rnat;
	__be16 nat_port = 0;
	__be16 port;
	int ret;

	if (p->protocol != CEL_PROTO_TCP && p->protocol != CEL_PROTO_UDP)
		return 0;
	__builtin_memcpy(key.vip, p->daddr, 16);
	key.dport = p->dport;
	key.protocol = p->protocol;
	svc = bpf_map_lookup_elem(&cel_lb6_services, &key);
	if (!svc)
		return 0;
	count = svc->count;
	rnat = svc->rev_nat_id;
	timeout = svc->backend_id; /* slot 0: the affinity timeout */

	ct6_key_from_pkt(&c->skey, p, CEL_CT_F_SERVICE);
	se = bpf_map_lookup_elem(&cel_ct6, &c->skey);
	if (se && se->expires_ns > now && !ct_is_reopen(se, &cp)) {
		id = se->backend_id;
		be = bpf_map_lookup_elem(&cel_lb6_backends, &id);
		if (be) {
			ct_account(se, CEL_CT_FORWARD, &cp, cfg, now);
			nat_port = se->nat_port;
		}
	}
	if (!be) {
		if ((svc->flags & CEL_SVC_F_SOURCE_RANGE) && !lb6_src_range_ok(rnat, p->saddr))
			return CEL_REASON_NOT_IN_SRC_RANGE;
		if (count == 0)
			return CEL_REASON_NO_SERVICE_BACKEND;
		id = lb6_select(&key, count, rnat, timeout, p, now);
		be = bpf_map_lookup_elem(&cel_lb6_backends, &id);
		if (!be)
			return CEL_REASON_NO_SERVICE_BACKEND;
		c->commit = 1;
		c->affinity = timeout != 0;
	}

	__builtin_memcpy(addr, be->addr, 16);
	port = be->port;
	c->rev_nat_id = rnat;
	c->backend_id = id;
	ret = nat6_rewrite(skb, p, NAT_DST, addr, port);
	if (ret || !nat_port)
		return ret;
	return lb6_port_rewrite(skb, p, NAT_SRC, nat_port);
}

/*
 * lb4_hairpin for IPv6. Cilium's IPv6 loopback, fe80::1, would be a
 * link-local peer: the pod would solicit it on its link and scope the
 * connection to its interface. This one, 100::42:1, is in the discard-only
 * block (RFC 6666), which no host ever holds; the pod reaches it through its
 * default route like any other address, and lb6_hairpin_reply takes it out
 * of the replies before anything else sees them.
 */
#define CEL_LB6_LOOPBACK_W0 bpf_htonl(0x01000000)
#define CEL_LB6_LOOPBACK_W3 bpf_htonl(0x00420001)

static __always_inline int lb6_is_loopback(const __u8 *a)
{
	__u32 w[4];

	__builtin_memcpy(w, a, 16);
	return w[0] == CEL_LB6_LOOPBACK_W0 && !w[1] && !w[2] && w[3] == CEL_LB6_LOOPBACK_W3;
}

static __always_inline int ipv6_equal(const __u8 *a, const __u8 *b)
{
	__u32 x[4], y[4];

	__builtin_memcpy(x, a, 16);
	__builtin_memcpy(y, b, 16);
	return ((x[0] ^ y[0]) | (x[1] ^ y[1]) | (x[2] ^ y[2]) | (x[3] ^ y[3])) == 0;
}

static __always_inline int lb6_hairpin(struct __sk_buff *skb, struct pkt6 *p,
				       const struct lb6_choice *c)
{
	/* Written word by word into memory the compiler cannot see as a
	 * constant: a constant array would become a .rodata map. */
	volatile __u32 lo[4];

	if (!c->backend_id || !ipv6_equal(p->saddr, p->daddr))
		return 0;
	lo[0] = CEL_LB6_LOOPBACK_W0;
	lo[1] = 0;
	lo[2] = 0;
	lo[3] = CEL_LB6_LOOPBACK_W3;
	return nat6_rewrite(skb, p, NAT_SRC, (const __u8 *)lo, p->sport);
}

static __always_inline int lb6_hairpin_reply(struct __sk_buff *skb, struct pkt6 *p)
{
	__u8 client[16];

	if (!lb6_is_loopback(p->daddr))
		return 0;
	__builtin_memcpy(client, p->saddr, 16);
	return nat6_rewrite(skb, p, NAT_DST, client, p->dport) ? -1 : 1;
}

/* lb4_taken for IPv6. */
static __always_inline int lb6_taken(const struct ct6_key *k, __u16 rev_nat_id, __u64 now)
{
	struct ct_entry *e = bpf_map_lookup_elem(&cel_ct6, k);

	/* A closing TCP connection's tuple is free: conntrack takes a SYN on it
	 * as a new connection (ct_is_reopen), as netfilter does. Counting it
	 * would move every reused client port into the clash range, which a
	 * burst of short connections exhausts. */
	return e && e->expires_ns > now && e->state != CEL_CT_STATE_CLOSING &&
	       (!rev_nat_id || e->rev_nat_id != rev_nat_id);
}

/* lb4_unclash for IPv6. */
static __noinline int lb6_unclash(struct __sk_buff *skb, struct pkt6 *p,
				       struct lb6_choice *c, struct ct6_key *k, __u64 now)
{
	__u32 h, i;

	if (!c->commit)
		return 0;
	ct6_key_from_pkt(k, p, 0);
	if (!lb6_taken(k, c->rev_nat_id, now))
		return 0;
	h = bpf_get_prandom_u32();
	for (i = 0; i < CEL_LB_CLASH_TRIES; i++) {
		k->sport = bpf_htons(CEL_LB_CLASH_PORT_MIN + (h + i) % CEL_LB_CLASH_PORTS);
		if (!lb6_taken(k, 0, now)) {
			c->orig_sport = p->sport;
			c->nat_sport = k->sport;
			return lb6_port_rewrite(skb, p, NAT_SRC, k->sport);
		}
	}
	return CEL_REASON_NAT_FAILED;
}

static __noinline void lb6_set_nat_port(const struct ct6_key *key, __be16 port)
{
	struct ct_entry *e = bpf_map_lookup_elem(&cel_ct6, key);

	if (e)
		e->nat_port = port;
}

static __always_inline void lb6_note_clash(const struct ct6_key *key, const struct lb6_choice *c)
{
	if (c->nat_sport)
		lb6_set_nat_port(key, c->orig_sport);
}

static __always_inline int lb6_restore_port(struct __sk_buff *skb, struct pkt6 *p,
					    const struct ct_entry *ce)
{
	__be16 port = ce->nat_port;

	if (!port)
		return 0;
	return lb6_port_rewrite(skb, p, NAT_DST, port) ? CEL_REASON_NAT_FAILED : 0;
}

static __always_inline int lb6_commit(const struct lb6_choice *c, const struct pkt6 *p,
				      const struct datapath_config *cfg, __u64 now)
{
	struct lb6_affinity_key akey = { .rev_nat_id = c->rev_nat_id };
	struct lb_affinity_val av = { .last_used_ns = now, .backend_id = c->backend_id };
	int ret;

	if (!c->commit)
		return 0;
	ret = ct_create6(&c->skey, p, cfg, now, c->rev_nat_id, c->backend_id);
	if (!ret && c->nat_sport)
		lb6_set_nat_port(&c->skey, c->nat_sport);
	if (!ret && c->affinity) {
		__builtin_memcpy(akey.client, c->skey.saddr, 16);
		bpf_map_update_elem(&cel_lb6_affinity, &akey, &av, BPF_ANY);
	}
	return ret;
}

static __always_inline int lb6_rev_nat(struct __sk_buff *skb, struct pkt6 *p, __u16 rev_nat_id,
				       const struct datapath_config *cfg, __u64 now)
{
	struct lb6_reverse_nat *rn = bpf_map_lookup_elem(&cel_lb6_revnat, &rev_nat_id);
	struct ct6_key skey = {};
	struct ct_entry *se;
	__u8 vip[16];
	__be16 port;

	if (!rn)
		return 0;
	__builtin_memcpy(vip, rn->vip, 16);
	port = rn->port;

	__builtin_memcpy(skey.saddr, p->daddr, 16);
	__builtin_memcpy(skey.daddr, vip, 16);
	skey.sport = p->dport;
	skey.dport = port;
	skey.protocol = p->protocol;
	skey.flags = CEL_CT_F_SERVICE;
	se = bpf_map_lookup_elem(&cel_ct6, &skey);
	if (se) {
		struct ct_pkt cp = ct_pkt6(p);

		ct_account(se, CEL_CT_REPLY, &cp, cfg, now);
	}

	return nat6_rewrite(skb, p, NAT_SRC, vip, port);
}

#endif /* CELLIUM_LIB_LB_H */
