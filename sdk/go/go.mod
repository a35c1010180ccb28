module github.com/sluice-proxy/sluice/sdk/go

go 1.26
