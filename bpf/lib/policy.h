/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Policy decision for a new connection: two LPM lookups, one for the peer's
 * identity and one for "any identity" (0). A deny from either wins, then an
 * allow from either, then default deny, but only when the endpoint enforces
 * this direction.
 */
#ifndef CELLIUM_LIB_POLICY_H
#define CELLIUM_LIB_POLICY_H

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#include "ipv6.h"
#include "maps.h"
#include "notify.h"
#include "packet.h"

/* Or'ed into a drop reason by the lookups: an audit lets the drop through. */
#define CEL_POLICY_AUDITED 0x100

/* Endpoint `endpoint_id`'s own policy map, or NULL. */
static __always_inline void *policy_map_of(__u16 endpoint_id)
{
	__u32 id = endpoint_id;

	return bpf_map_lookup_elem(&cel_policy, &id);
}

/* In `map`, an endpoint's policy map: returns CEL_REASON_FORWARDED (0) when allowed, else the drop reason
 * (with CEL_POLICY_AUDITED when only audited deny entries matched: an enforced
 * deny wins over them, they win over an allow); *by_peer is set when the
 * entry for the peer's own identity matched. */
static __always_inline int policy_lookup(void *map, __u16 endpoint_id, __u8 direction,
					 __u32 identity, __u8 protocol, __be16 dport, int *by_peer)
{
	struct policy_key key = {};
	struct policy_value *v;
	/* One variable for both kinds of deny (1 enforced, 2 audited): every
	 * register counts in the callers this is inlined into. */
	int allow = 0, deny = 0;

	key.prefixlen = CEL_POLICY_PREFIX_FULL;
	key.endpoint_id = endpoint_id;
	key.direction = direction;
	key.identity = identity;
	key.protocol = protocol;
	key.dport = dport;
	/* Flags instead of `exact || any`: clang would OR the two pointers,
	 * which the verifier rejects. */
	v = bpf_map_lookup_elem(map, &key);
	if (v) {
		deny |= v->flags & CEL_POLICY_F_AUDIT ? 2 : v->deny;
		allow = 1;
		*by_peer = 1;
	}
	key.identity = 0;
	v = bpf_map_lookup_elem(map, &key);
	if (v) {
		deny |= v->flags & CEL_POLICY_F_AUDIT ? 2 : v->deny;
		allow = 1;
	}

	if (deny & 1)
		return CEL_REASON_POLICY_DENY;
	if (deny)
		return CEL_REASON_POLICY_DENY | CEL_POLICY_AUDITED;
	if (allow)
		return CEL_REASON_FORWARDED;
	return CEL_REASON_POLICY_DEFAULT_DENY;
}

/* Whether `identity` has an entry for any protocol and port: events only,
 * so the lookup costs nothing while they are off. */
static __always_inline int policy_any_port(__u16 endpoint_id, __u8 direction, __u32 identity)
{
	struct policy_key key = {};
	void *map = policy_map_of(endpoint_id);

	if (!map)
		return 0;
	key.prefixlen = CEL_POLICY_PREFIX_ANY_PROTO;
	key.endpoint_id = endpoint_id;
	key.direction = direction;
	key.identity = identity;
	return bpf_map_lookup_elem(map, &key) != NULL;
}

/* Whether endpoint `ep` lets a new connection through in `direction`:
 * CEL_REASON_FORWARDED (0) or the drop reason, with CEL_POLICY_AUDITED when
 * an audit lets it through. *by_peer as policy_lookup sets it; -1 when the
 * direction is not enforced. */
static __always_inline int policy_verdict(const struct endpoint_info *ep, __u8 direction,
					  __u32 peer_identity, __u8 protocol, __be16 dport,
					  __u8 icmp_type, int *by_peer)
{
	__u16 enforce = direction == CEL_DIR_INGRESS ? CEL_EP_F_ENFORCE_INGRESS
						     : CEL_EP_F_ENFORCE_EGRESS;
	__u16 audit = direction == CEL_DIR_INGRESS ? CEL_EP_F_AUDIT_INGRESS
						   : CEL_EP_F_AUDIT_EGRESS;
	void *map;
	int reason;

	if (!(ep->flags & enforce)) {
		*by_peer = -1;
		return CEL_REASON_FORWARDED;
	}
	map = policy_map_of(ep->id);
	if (!map)
		return CEL_REASON_NO_POLICY_MAP;
	/* ICMP has no port: its type takes the port's place (Cilium's icmps). */
	if (protocol == CEL_PROTO_ICMP || protocol == CEL_PROTO_ICMPV6)
		dport = bpf_htons(icmp_type);
	reason = policy_lookup(map, ep->id, direction, peer_identity, protocol, dport, by_peer);
	if (reason == CEL_REASON_POLICY_DEFAULT_DENY && (ep->flags & audit))
		reason |= CEL_POLICY_AUDITED;
	return reason;
}


/* The CEL_MATCH_* of a decision, for events. */
static __always_inline __u8 policy_match(const struct endpoint_info *ep, __u8 direction,
					 __u32 peer_identity, int reason, int by_peer)
{
	if (reason)
		return CEL_MATCH_NONE;
	if (by_peer < 0)
		return CEL_MATCH_ALL;
	if (by_peer)
		return policy_any_port(ep->id, direction, peer_identity) ? CEL_MATCH_L3_ONLY
									 : CEL_MATCH_L3_L4;
	return policy_any_port(ep->id, direction, 0) ? CEL_MATCH_ALL : CEL_MATCH_L4_ONLY;
}

static __always_inline int verdict_events(const struct datapath_config *cfg)
{
	return cfg && (cfg->flags & CEL_CFG_F_POLICY_VERDICT_EVENTS);
}

/* The trace of a verdict: about `ep`, in `direction`. */
static __always_inline struct trace verdict_trace(const struct trace *t,
						  const struct endpoint_info *ep,
						  __u8 direction)
{
	struct trace vt = *t;

	vt.direction = direction;
	vt.endpoint_id = ep->id;
	return vt;
}

/*
 * Decides one direction for endpoint `ep` and reports the verdict when the
 * configuration asks for it. `peer_identity` is the other side's identity;
 * *match is set (CEL_MATCH_*) only while verdict or trace events are on.
 */
static __always_inline int policy_check(struct __sk_buff *skb, const struct pkt *p,
					const struct trace *t,
					const struct endpoint_info *ep, __u8 direction,
					__u32 peer_identity, const struct datapath_config *cfg,
					__u8 *match)
{
	int by_peer = 0;
	int reason = policy_verdict(ep, direction, peer_identity, p->protocol, p->dport,
				    p->icmp_type, &by_peer);
	int verdicts = verdict_events(cfg);

	/* The audit bit stays in `reason` (no variable more: this is inlined into
	 * the largest frames). */
	if (reason & CEL_POLICY_AUDITED)
		*match = CEL_MATCH_NONE;
	else if (verdicts || trace_events(cfg))
		*match = policy_match(ep, direction, peer_identity, reason, by_peer);
	/* One call site: the event is inlined, and each copy takes its own stack. */
	if (verdicts || (reason & CEL_POLICY_AUDITED)) {
		struct trace vt = verdict_trace(t, ep, direction);

		vt.match = *match;
		emit_event(skb, p, &vt, CEL_EVENT_POLICY_VERDICT, reason & 0xff,
			   reason & CEL_POLICY_AUDITED ? CEL_VERDICT_AUDIT
			   : reason == CEL_REASON_FORWARDED ? CEL_VERDICT_ALLOWED : CEL_VERDICT_DENIED);
	}
	return reason & CEL_POLICY_AUDITED ? CEL_REASON_FORWARDED : reason;
}

static __always_inline int policy_check6(struct __sk_buff *skb, const struct pkt6 *p,
					 const struct trace *t,
					 const struct endpoint_info *ep, __u8 direction,
					 __u32 peer_identity, const struct datapath_config *cfg,
					 __u8 *match)
{
	int by_peer = 0;
	int reason = policy_verdict(ep, direction, peer_identity, p->protocol, p->dport,
				    p->icmp_type, &by_peer);
	int verdicts = verdict_events(cfg);

	/* The audit bit stays in `reason` (no variable more: this is inlined into
	 * the largest frames). */
	if (reason & CEL_POLICY_AUDITED)
		*match = CEL_MATCH_NONE;
	else if (verdicts || trace_events(cfg))
		*match = policy_match(ep, direction, peer_identity, reason, by_peer);
	/* One call site: the event is inlined, and each copy takes its own stack. */
	if (verdicts || (reason & CEL_POLICY_AUDITED)) {
		struct trace vt = verdict_trace(t, ep, direction);

		vt.match = *match;
		emit_event6(skb, p, &vt, CEL_EVENT_POLICY_VERDICT, reason & 0xff,
			    reason & CEL_POLICY_AUDITED ? CEL_VERDICT_AUDIT
			    : reason == CEL_REASON_FORWARDED ? CEL_VERDICT_ALLOWED : CEL_VERDICT_DENIED);
	}
	return reason & CEL_POLICY_AUDITED ? CEL_REASON_FORWARDED : reason;
}

#endif /* CELLIUM_LIB_POLICY_H */
