package bench

import (
	"math/rand/v2"

	"github.com/kvroute/kvroute/config"
)

// admissionQoS is the VirtualQoS of an admission run (VirtualOptions.Admission) over n
// items: every request in o.Admission from tenant "all", or, with o.High and
// o.HighShare, each in o.High from tenant "high" with probability o.HighShare (drawn
// from o.Seed).
func admissionQoS(o *VirtualOptions, n int) *VirtualQoS {
	cls := *o.Admission
	tenant := func(int) string { return "all" }
	var high config.Class
	if o.High != nil && o.HighShare > 0 {
		high = *o.High
		rng := rand.New(rand.NewPCG(o.Seed, 0x4a9))
		hi := make([]bool, n)
		for i := range hi {
			hi[i] = rng.Float64() < o.HighShare
		}
		tenant = func(i int) string {
			if hi[i] {
				return "high"
			}
			return "all"
		}
	}
	return &VirtualQoS{Tenant: tenant, Class: func(t string) config.Class {
		if t == "high" {
			return high
		}
		return cls
	}}
}
