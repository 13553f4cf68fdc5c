module corral/agent

go 1.19
