/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * cel_metrics: PERCPU_ARRAY indexed by direction * CEL_REASON_SLOTS + reason.
 */
#ifndef CELLIUM_METRICS_H
#define CELLIUM_METRICS_H

#include <linux/types.h>

struct metrics_value {
	__u64 packets;
	__u64 bytes;
};

#endif /* CELLIUM_METRICS_H */
