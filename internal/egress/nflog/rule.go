package nflog

import (
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The rate each log rule may log at, so a flood cannot swamp the reader or the socket buffer.
const (
	LogRate  = 200 // packets a second
	LogBurst = 400 // packets logged at once above the rate
)

// maxPrefix is the longest prefix the kernel takes (NF_LOG_PREFIXLEN less the NUL).
const maxPrefix = 127

// LogExprs returns the expressions `limit rate 200/second burst 400 packets log group G prefix P`,
// with no verdict. They belong in a rule of their own, after the same match as the drop rule it
// precedes:
//
//	<match> limit rate 200/second burst 400 packets log group G prefix P   (LogExprs)
//	<match> counter drop
//
// The limit must only gate the log: a limit over its rate ends its rule, so in one rule with the
// drop it would let the flood's packets through. In a rule of its own, a limited packet just goes
// on to the drop rule, which drops and counts every packet whatever was logged. (A verdict ends a
// rule, so there is no way to put the log after the drop in one rule either.)
//
// Each rule has its own limit, so the reader may see up to LogRate a second per log rule. A prefix
// longer than 127 bytes is cut there.
func LogExprs(group uint16, prefix string) []expr.Any {
	if len(prefix) > maxPrefix {
		prefix = prefix[:maxPrefix]
	}
	return []expr.Any{
		&expr.Limit{Type: expr.LimitTypePkts, Rate: LogRate, Unit: expr.LimitTimeSecond, Burst: LogBurst},
		&expr.Log{
			Key:   1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_PREFIX,
			Group: group,
			Data:  []byte(prefix),
		},
	}
}
