package config

// Discovery configures where workers come from besides the static list.
type Discovery struct {
	// Mode is "static" (the workers list).
	Mode string `mapstructure:"mode"`
}

func defaultDiscovery() Discovery { return Discovery{Mode: "static"} }

func (d Discovery) validate() error {
	switch d.Mode {
	case "static":
		return nil
	}
	return fieldErr("discovery.mode", "unknown mode %q (one of static)", d.Mode)
}
