module github.com/corral-dev/corral/sdk/go

go 1.26.0
