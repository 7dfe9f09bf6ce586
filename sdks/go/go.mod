module github.com/koder-ai/koder-sandbox/sdks/go

go 1.19
