package netpolicy

import (
	"net/netip"
	"slices"
	"testing"
)

func TestPrefixesOf(t *testing.T) {
	a := func(s string) uint32 { return u32(netip.MustParseAddr(s)) }
	tests := []struct {
		spans []span
		want  []string
	}{
		{[]span{{0, 0xFFFFFFFF}}, []string{"0.0.0.0/0"}},
		{[]span{{a("10.0.0.0"), a("10.0.0.4")}}, []string{"10.0.0.0/30", "10.0.0.4/32"}},
		{[]span{{a("10.0.0.6"), a("10.255.255.255")}}, []string{"10.0.0.6/31", "10.0.0.8/29", "10.0.0.16/28", "10.0.0.32/27",
			"10.0.0.64/26", "10.0.0.128/25", "10.0.1.0/24", "10.0.2.0/23", "10.0.4.0/22", "10.0.8.0/21", "10.0.16.0/20",
			"10.0.32.0/19", "10.0.64.0/18", "10.0.128.0/17", "10.1.0.0/16", "10.2.0.0/15", "10.4.0.0/14", "10.8.0.0/13",
			"10.16.0.0/12", "10.32.0.0/11", "10.64.0.0/10", "10.128.0.0/9"}},
		{[]span{{a("255.255.255.255"), a("255.255.255.255")}, {a("240.0.0.0"), a("255.255.255.254")}}, []string{"240.0.0.0/4"}},
		{[]span{{a("1.0.0.0"), a("1.0.0.255")}, {a("1.0.1.0"), a("1.0.1.255")}, {a("1.0.0.7"), a("1.0.0.9")}}, []string{"1.0.0.0/23"}},
		{nil, nil},
	}
	for _, tt := range tests {
		var got []string
		for _, p := range prefixesOf(tt.spans) {
			got = append(got, p.String())
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("prefixesOf(%v) = %v, want %v", tt.spans, got, tt.want)
		}
	}
}

func TestComplementPorts(t *testing.T) {
	tests := []struct {
		in, want []PortRange
	}{
		{nil, []PortRange{AllPorts}},
		{[]PortRange{AllPorts}, nil},
		{[]PortRange{{8080, 8080}}, []PortRange{{0, 8079}, {8081, 65535}}},
		{[]PortRange{{0, 10}, {11, 20}, {15, 30}}, []PortRange{{31, 65535}}},
		{[]PortRange{{100, 200}, {1, 5}, {65535, 65535}}, []PortRange{{0, 0}, {6, 99}, {201, 65534}}},
	}
	for _, tt := range tests {
		if got := complementPorts(tt.in); !slices.Equal(got, tt.want) {
			t.Errorf("complementPorts(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
}
