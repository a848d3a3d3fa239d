import DLCore
import Foundation

#if canImport(FoundationXML)
    import FoundationXML
#endif

/// Reads a Metalink document's XML with FoundationXML's `XMLParser` (libxml2's SAX parser)
/// into `MetalinkElement`s, then `Metalink.read` says what they mean.
///
/// Here and not in DLCore: FoundationXML brings libxml2 into whatever links it, and DLCore is
/// the dependency-free core every target and fuzz target builds on. DLRPC already reads the
/// other untrusted text of a request (JSON), decodes `enqueue`'s `metalink` param, and is what
/// the daemon, dlctl and the fuzz targets link.
///
/// Hostile input: the size is checked before parsing; a document with a DTD (`<!DOCTYPE`,
/// `<!ENTITY`) is refused before parsing, so that no entity is ever declared, let alone
/// expanded (billion laughs, external entities); external entities are not resolved anyway;
/// depth, element count and text per element are bounded while parsing, which stops at the
/// first one broken.
public enum MetalinkReader {
    public static func parse(_ data: Data, limits: MetalinkLimits = MetalinkLimits()) throws(DLError) -> Metalink {
        guard data.count <= limits.maxBytes else {
            throw Metalink.invalid("the document is \(data.count) bytes; at most \(limits.maxBytes)")
        }
        guard !data.isEmpty else { throw Metalink.invalid("the document is empty") }
        // UTF-8 only: libxml2 would also read UTF-16 or EBCDIC, where the scan for a DTD below
        // would not see one.
        guard !data.contains(0), let text = String(data: data, encoding: .utf8) else {
            throw Metalink.invalid("the document is not UTF-8 text")
        }
        if let declared = declaredEncoding(text), !["utf-8", "utf8", "us-ascii"].contains(declared.lowercased()) {
            throw Metalink.invalid("the document declares the encoding \"\(declared.prefix(40))\"; only UTF-8 is read")
        }
        // FoundationXML reads a processing instruction without data (`<?name?>`) with strlen
        // on a null pointer: the process dies (found by fuzz-metalink). A Metalink has none
        // besides its XML declaration, which libxml2 does not report as one.
        if Self.hasProcessingInstruction(data) {
            throw Metalink.invalid("a processing instruction (<?…?>) other than the XML declaration is not accepted")
        }
        if data.range(of: Data("<!DOCTYPE".utf8)) != nil || data.range(of: Data("<!ENTITY".utf8)) != nil {
            throw Metalink.invalid("a document type declaration (<!DOCTYPE or <!ENTITY) is not accepted")
        }
        let builder = TreeBuilder(limits: limits)
        let parser = XMLParser(data: data)
        parser.shouldProcessNamespaces = true
        parser.shouldReportNamespacePrefixes = false
        parser.shouldResolveExternalEntities = false
        parser.delegate = builder
        let parsed = parser.parse()
        if let refusal = builder.refusal { throw Metalink.invalid(refusal) }
        guard parsed, let root = builder.root else {
            let reason = parser.parserError.map { ($0 as NSError).localizedDescription } ?? "no root element"
            throw Metalink.invalid("not well-formed XML (line \(parser.lineNumber)): \(reason.prefix(200))")
        }
        return try Metalink.read(root, limits: limits)
    }

    /// Whether `<?` appears anywhere but at the XML declaration (`<?xml` and a space, first in
    /// the document after an optional byte order mark).
    static func hasProcessingInstruction(_ data: Data) -> Bool {
        let bytes = [UInt8](data)
        let start = bytes.starts(with: [0xEF, 0xBB, 0xBF]) ? 3 : 0
        var index = 0
        while index + 1 < bytes.count {
            if bytes[index] == UInt8(ascii: "<"), bytes[index + 1] == UInt8(ascii: "?") {
                let declaration = Array("<?xml".utf8)
                let isDeclaration =
                    index == start && bytes[index...].starts(with: declaration) && index + 5 < bytes.count
                    && [UInt8(ascii: " "), UInt8(ascii: "\t"), UInt8(ascii: "\n"), UInt8(ascii: "\r")].contains(bytes[index + 5])
                if !isDeclaration { return true }
            }
            index += 1
        }
        return false
    }

    /// `encoding="…"` of the XML declaration, when there is one.
    static func declaredEncoding(_ text: String) -> String? {
        guard text.hasPrefix("<?xml"), let end = text.range(of: "?>") else { return nil }
        let declaration = text[..<end.lowerBound]
        guard let key = declaration.range(of: "encoding") else { return nil }
        let rest = declaration[key.upperBound...].drop { $0 == " " || $0 == "=" || $0 == "\t" }
        guard let quote = rest.first, quote == "\"" || quote == "'" else { return "" }
        return String(rest.dropFirst().prefix { $0 != quote })
    }

    public static func parse(_ text: String, limits: MetalinkLimits = MetalinkLimits()) throws(DLError) -> Metalink {
        try parse(Data(text.utf8), limits: limits)
    }
}

/// Builds the element tree from the parser's events, within the limits. It lives only for one
/// `parse` on the calling thread.
private final class TreeBuilder: NSObject, XMLParserDelegate {
    let limits: MetalinkLimits
    var stack: [MetalinkElement] = []
    var texts: [String] = []
    var root: MetalinkElement?
    var elements = 0
    /// Why parsing was stopped, when a limit was broken.
    var refusal: String?

    init(limits: MetalinkLimits) {
        self.limits = limits
    }

    private func refuse(_ parser: XMLParser, _ reason: String) {
        if refusal == nil { refusal = reason }
        parser.abortParsing()
    }

    func parser(
        _ parser: XMLParser, didStartElement elementName: String, namespaceURI: String?, qualifiedName qName: String?,
        attributes attributeDict: [String: String] = [:]
    ) {
        guard refusal == nil else { return }
        elements += 1
        guard elements <= limits.maxElements else { return refuse(parser, "more than \(limits.maxElements) elements") }
        guard stack.count < limits.maxDepth else { return refuse(parser, "elements nested deeper than \(limits.maxDepth)") }
        stack.append(MetalinkElement(name: elementName, namespace: namespaceURI, attributes: attributeDict))
        texts.append("")
    }

    func parser(_ parser: XMLParser, foundCharacters string: String) {
        guard refusal == nil, !texts.isEmpty else { return }
        texts[texts.count - 1] += string
        if texts[texts.count - 1].utf8.count > limits.maxTextBytes {
            refuse(parser, "an element holds more than \(limits.maxTextBytes) bytes of text")
        }
    }

    func parser(_ parser: XMLParser, foundCDATA CDATABlock: Data) {
        self.parser(parser, foundCharacters: String(decoding: CDATABlock, as: UTF8.self))
    }

    func parser(_ parser: XMLParser, didEndElement elementName: String, namespaceURI: String?, qualifiedName qName: String?) {
        guard refusal == nil, var element = stack.popLast(), let text = texts.popLast() else { return }
        element.text = text.trimmingCharacters(in: .whitespacesAndNewlines)
        if stack.isEmpty {
            root = element
        } else {
            stack[stack.count - 1].children.append(element)
        }
    }

    // Belt and braces: the DTD was refused before parsing.
    func parser(_ parser: XMLParser, foundInternalEntityDeclarationWithName name: String, value: String?) {
        refuse(parser, "an entity declaration is not accepted")
    }

    func parser(_ parser: XMLParser, foundExternalEntityDeclarationWithName name: String, publicID: String?, systemID: String?) {
        refuse(parser, "an entity declaration is not accepted")
    }

    func parser(_ parser: XMLParser, resolveExternalEntityName name: String, systemID: String?) -> Data? { nil }
}
