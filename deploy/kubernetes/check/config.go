package check

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Config is the part of a Sluice configuration the manifests must agree with. Other keys are
// Sluice's to check (`sluice check`); this one reads only what it needs.
type Config struct {
	Runtime struct {
		ShutdownGrace string `toml:"shutdown_grace"`
	} `toml:"runtime"`
	Admin struct {
		Listen string `toml:"listen"`
		Token  string `toml:"token"`
	} `toml:"admin"`
	Acceptor struct {
		Listen string `toml:"listen"`
	} `toml:"acceptor"`
	Listeners []struct {
		Name   string `toml:"name"`
		Listen string `toml:"listen"`
	} `toml:"listener"`
	Clusters map[string]struct {
		Kind   string   `toml:"kind"`
		Tokens []string `toml:"tokens"`
	} `toml:"cluster"`
}

// ParseConfig reads a Sluice configuration.
func ParseConfig(text string) (*Config, error) {
	var c Config
	if _, err := toml.Decode(text, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// Port is the port of an IP:PORT listen address.
func Port(listen string) (int, error) {
	_, port, err := net.SplitHostPort(listen)
	if err != nil {
		return 0, fmt.Errorf("listen %q: %w", listen, err)
	}
	return strconv.Atoi(port)
}

// ShutdownGrace is [runtime] shutdown_grace (Sluice's default, 30 s, when unset).
func (c *Config) ShutdownGrace() (time.Duration, error) {
	if c.Runtime.ShutdownGrace == "" {
		return 30 * time.Second, nil
	}
	return time.ParseDuration(c.Runtime.ShutdownGrace)
}

// EnvSecrets are the environment variables the configuration reads (`env:NAME` values).
func (c *Config) EnvSecrets() []string {
	var names []string
	add := func(v string) {
		if name, ok := strings.CutPrefix(v, "env:"); ok {
			names = append(names, name)
		}
	}
	add(c.Admin.Token)
	for _, cl := range c.Clusters {
		for _, t := range cl.Tokens {
			add(t)
		}
	}
	return names
}
