// Package promcheck scrapes a real sluice's /metrics as Prometheus does and reads it with
// Prometheus' own parsers; it has only tests.
package promcheck
