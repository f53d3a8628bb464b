"""Infrastructure every stage may use, and that imports nothing of them: errors with their exit codes,
the one token, price, atomic-write and cache-layout rules, redaction, progress reporting, threads, asyncio."""
