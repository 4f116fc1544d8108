// Compiles each pattern of the JSON array on stdin ({pattern, value}) as
// the TypeScript client's AJV does (JavaScript's RegExp with the u flag),
// and matches the value when there is one. Prints a JSON array of
// {compiles, matches}.
let input = '';
for await (const chunk of process.stdin) input += chunk;
const verdicts = JSON.parse(input).map(({ pattern, value }) => {
  let re;
  try { re = new RegExp(pattern, 'u'); } catch { return { compiles: false, matches: false }; }
  return { compiles: true, matches: value !== undefined && re.test(value) };
});
console.log(JSON.stringify(verdicts));
