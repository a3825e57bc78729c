"""`reef demo`: the whole loop (serve, observe, grow, commit) learning on the embedded model,
with a built-in task stream and a strict verifier (`reef.demo.tasks`) and a live learning curve
(`reef.demo.run`)."""
